//! Shared mode and the ownership of its regions: a region that is not the caller's
//! alone is refused, never mapped (issue 12, item 5), and a creator removes only the
//! region it made, not a newer one of the same name (item 6).

use std::fs::{self, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use replaybuf::error::PersistError;
use replaybuf::ReplayBuffer;

mod common;
use common::shm::{builder, path_of, plant, Cleanup};

fn name(test: &str) -> String {
    common::shm::name("owner", test)
}

/// The persistence error under a build error.
fn persist_of(e: &replaybuf::error::BuildError) -> &PersistError {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<PersistError>())
        .unwrap_or_else(|| panic!("not a persistence error: {e}"))
}

/// `attach`, `existsok` and the configuration read of `attach` all refuse the planted
/// region `name`, naming it, its owner and its mode, and leave it as it was.
fn refused_everywhere(name: &str, owner: u32, mode: u32) {
    let path = path_of(name);
    let before = fs::read(&path).unwrap();
    let shown = format!("{}", path.display());
    let (owner_said, mode_said) = (format!("uid {owner}"), format!("{mode:o}"));

    let e = match ReplayBuffer::attach(name) {
        Ok(_) => panic!("attach mapped a region that is not this user's alone"),
        Err(e) => e,
    };
    assert!(e.is_foreign(), "{e}");
    let said = e.to_string();
    assert!(said.contains(&shown), "{said}");
    assert!(said.contains(&owner_said), "{said}");
    assert!(said.contains(&mode_said), "{said}");
    assert_eq!(e.path(), Path::new(&path));

    let e = match builder(name).existsok(true).build() {
        Ok(_) => panic!("existsok mapped a region that is not this user's alone"),
        Err(e) => e,
    };
    assert!(persist_of(&e).is_foreign(), "{e}");
    assert!(e.to_string().contains(&owner_said), "{e}");

    // Without existsok the name is taken: refused before anything is opened.
    let e = builder(name).build().err().unwrap();
    assert!(persist_of(&e).is_exists(), "{e}");

    // Untouched: same length, same bytes, same owner and mode.
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), before.len() as u64, "the region was resized");
    assert!(fs::read(&path).unwrap() == before, "the region was written");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (owner, mode));
}

#[test]
fn a_world_writable_region_is_refused_and_left_untouched() {
    let name = name("world");
    let bytes = common::shm::real_region_bytes("owner", "world");
    let _cleanup = plant(&name, &bytes, 0o666);
    let me = fs::metadata(path_of(&name)).unwrap().uid();
    refused_everywhere(&name, me, 0o666);
}

#[test]
fn a_group_readable_region_is_refused() {
    let name = name("group");
    let bytes = common::shm::real_region_bytes("owner", "group");
    let _cleanup = plant(&name, &bytes, 0o640);
    let me = fs::metadata(path_of(&name)).unwrap().uid();
    refused_everywhere(&name, me, 0o640);
}

#[test]
fn another_users_owner_only_region_is_refused() {
    const NOBODY: u32 = 65534;
    let name = name("nobody");
    let bytes = common::shm::real_region_bytes("owner", "nobody");
    let cleanup = plant(&name, &bytes, 0o600);
    if std::os::unix::fs::chown(&cleanup.0, Some(NOBODY), None).is_err() {
        // Only root can give a file away; elsewhere there is nothing to test.
        eprintln!("skipped: chown needs root");
        return;
    }
    refused_everywhere(&name, NOBODY, 0o600);
}

#[test]
fn a_symbolic_link_under_a_regions_name_is_not_followed() {
    // The link points at an owner-only copy of a real region: followed, it would pass
    // the owner check and be mapped (and written).
    let name = name("link");
    let bytes = common::shm::real_region_bytes("owner", "link");
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("region");
    fs::write(&target, &bytes).unwrap();
    fs::set_permissions(&target, Permissions::from_mode(0o600)).unwrap();
    let path = path_of(&name);
    let _ = fs::remove_file(&path);
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let _cleanup = Cleanup(path.clone());

    let e = match ReplayBuffer::attach(&name) {
        Ok(_) => panic!("attach followed a symbolic link"),
        Err(e) => e,
    };
    assert!(e.is_foreign(), "{e}");
    let e = match builder(&name).existsok(true).build() {
        Ok(_) => panic!("existsok followed a symbolic link"),
        Err(e) => e,
    };
    assert!(persist_of(&e).is_foreign(), "{e}");
    assert!(
        fs::read(&target).unwrap() == bytes,
        "the link's target was written"
    );
    let listed = replaybuf::shared::list();
    let found = listed.iter().find(|r| r.name == name).expect("listed");
    assert!(found.foreign && !found.is_stale(), "{found:?}");
}

#[test]
fn listing_marks_a_foreign_region_without_opening_it_and_never_stale() {
    let name = name("list");
    let bytes = common::shm::real_region_bytes("owner", "list");
    let _cleanup = plant(&name, &bytes, 0o666);
    let listed = replaybuf::shared::list();
    let found = listed.iter().find(|r| r.name == name).expect("listed");
    assert!(found.foreign, "{found:?}");
    assert!(
        !found.is_stale(),
        "a foreign region is never removed as stale"
    );
    let why = found.problem.as_deref().unwrap_or_default();
    assert!(why.contains("666"), "{found:?}");
}

#[test]
fn an_old_creator_leaves_a_newer_region_of_its_name_alone() {
    let name = name("newer");
    let path = path_of(&name);
    let _cleanup = Cleanup(path.clone());
    let a = builder(&name).build().unwrap();
    // What `replaybuf shm remove NAME` does: the name goes, A's mapping stays.
    replaybuf::shared::remove(&name).unwrap();
    assert!(!path.exists());
    let b = builder(&name).build().unwrap();
    drop(a);
    assert!(
        path.exists(),
        "the old creator removed the newer region's name"
    );
    let attached = ReplayBuffer::attach(&name).expect("the newer region is attachable");
    let mut batch = attached.batch([1]);
    batch.set("id", &[9u64]).unwrap();
    batch.set("x", &[1f32, 2.0]).unwrap();
    attached.extend(&batch).unwrap();
    assert_eq!(b.len(), 1, "attached to B's region");
    drop(attached);
    drop(b);
    assert!(!path.exists(), "the newer creator removes its own name");
}
