//! A small built-in simulator for the demonstration: a torque-limited pendulum
//! (the dynamics of Gym's `Pendulum-v1`), episodes of 200 steps.

/// Pendulum state and its deterministic dynamics.
#[derive(Clone, Copy, Debug)]
pub struct Pendulum {
    theta: f32,
    theta_dot: f32,
    t: u32,
}

pub const EPISODE_STEPS: u32 = 200;
const MAX_SPEED: f32 = 8.0;
const MAX_TORQUE: f32 = 2.0;
const DT: f32 = 0.05;
const G: f32 = 10.0;

/// One step's result.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    pub obs: [f32; 3],
    pub action: f32,
    pub reward: f32,
    pub next_obs: [f32; 3],
    pub truncated: bool,
}

impl Pendulum {
    pub fn new(rng: &mut u64) -> Pendulum {
        Pendulum {
            theta: (uniform(rng) * 2.0 - 1.0) * std::f32::consts::PI,
            theta_dot: uniform(rng) * 2.0 - 1.0,
            t: 0,
        }
    }

    pub fn observe(&self) -> [f32; 3] {
        [self.theta.cos(), self.theta.sin(), self.theta_dot]
    }

    /// The reward and next observation of `action` from observation `obs`: a pure
    /// function of the observation, so a learner can re-derive any stored transition.
    pub fn dynamics(obs: [f32; 3], action: f32) -> (f32, [f32; 3]) {
        let theta = obs[1].atan2(obs[0]);
        let u = action.clamp(-MAX_TORQUE, MAX_TORQUE);
        let reward = -(theta * theta + 0.1 * obs[2] * obs[2] + 0.001 * u * u);
        let theta_dot =
            (obs[2] + (3.0 * G / 2.0 * theta.sin() + 3.0 * u) * DT).clamp(-MAX_SPEED, MAX_SPEED);
        let next = theta + theta_dot * DT;
        (reward, [next.cos(), next.sin(), theta_dot])
    }

    /// Steps with `action`; resets after `EPISODE_STEPS` (the step is then truncated).
    pub fn step(&mut self, action: f32, rng: &mut u64) -> Step {
        let obs = self.observe();
        let (reward, next_obs) = Pendulum::dynamics(obs, action);
        self.theta = next_obs[1].atan2(next_obs[0]);
        self.theta_dot = next_obs[2];
        self.t += 1;
        let truncated = self.t == EPISODE_STEPS;
        if truncated {
            *self = Pendulum::new(rng);
        }
        Step {
            obs,
            action,
            reward,
            next_obs,
            truncated,
        }
    }
}

/// A noisy energy-pumping controller: enough structure for rewards to vary.
pub fn policy(obs: [f32; 3], rng: &mut u64) -> f32 {
    let pump = if obs[2] >= 0.0 { 1.0 } else { -1.0 };
    (pump * MAX_TORQUE * 0.8 + (uniform(rng) * 2.0 - 1.0)).clamp(-MAX_TORQUE, MAX_TORQUE)
}

/// xorshift64* in [0, 1).
pub fn uniform(state: &mut u64) -> f32 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    let x = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (x >> 40) as f32 / (1u64 << 24) as f32
}
