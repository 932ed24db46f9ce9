import replaybuf, time, sys
rb = replaybuf.ReplayBuffer(64, spec={"obs": ("float32", (3,)), "a": ("int64", ())}, memmap=sys.argv[1], existsok=True)
print("open", flush=True); time.sleep(float(sys.argv[2]))
