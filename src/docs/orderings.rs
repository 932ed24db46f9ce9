//! # Memory ordering: why a sampled row is never torn
//!
//! This page gathers the ordering argument of the whole crate. Each concurrent module
//! has its own `# Memory ordering` section; this is the map.
//!
//! ## The threads and what they share
//!
//! | thread | touches | how |
//! |---|---|---|
//! | collector (appender) | a shard's cursor, occupancy word, stream words, its claimed slots | `fetch_add`, plain stores of stamps, atomic row copy; a stream: stores of its words, non-temporal stores of whole slots, `sfence` |
//! | editor (`write_all`) | every shard's occupancy word, stamps of stored rows | `fetch_add`, compare-exchange |
//! | learner | cursors and floors (read), stamps (read), rows (read) | loads, atomic row copy |
//! | `empty()` | floors | `fetch_max` |
//! | learners of one epoch | the epoch's `next` and `closed` | `fetch_add`, load/store |
//! | collector (prioritized) | its rows' raw-priority words and leaves, the sums, min and max entries above them | plain stores, compare-exchange, `fetch_add` |
//! | priority updater | leaves, raw-priority words, sums, min and max entries | compare-exchange, `fetch_add`, `fetch_max` (a climb) |
//! | learner (prioritized) | sum entries and leaves (read), the min root (read) | `Relaxed` loads |
//! | every handle | the buffer's current state | an `ArcSwap` load per operation |
//! | swap | the old storage's occupancy and updaters' words, its `carrying` and `retired` flags; the state | freeze (`fetch_or`), stores and a `SeqCst` fence, thaw (`fetch_and`) |
//! | sample call, new handle | the storage's call and handle counters, its `carrying` flag (read) | `fetch_add`, a `SeqCst` fence, loads |
//!
//! Nobody ever takes a lock on the path between collectors and learners. The only
//! locks in the crate are cold: the without-replacement epoch turnover (learners only,
//! once per epoch), the max-value writer's placements, the prefetch handoff, and the
//! freeze a checkpoint takes (which holds writers, never readers).
//!
//! ## 1. The slot protocol (`storage/stamp.rs`)
//!
//! A seqlock per slot, made sound for the Rust memory model:
//!
//! ```text
//! writer:  W0 stamp.load(Acquire) shows the predecessor
//!          W1 stamp.store(writing)             (plain store, or CAS when editors exist)
//!          W2 fence(Release)
//!             row stores                        (atomic row copy)
//!          W3 stamp.store(published, Release)
//!
//! reader:  R1 s1 = stamp.load(Acquire)         (must be published)
//!             row loads                         (atomic row copy)
//!          R2 fence(Acquire)
//!          R3 s2 = stamp.load(Relaxed); whole iff s1 == s2
//! ```
//!
//! - W3 → R1 (release/acquire on the stamp): a reader that starts from a published
//!   stamp sees every byte of that row.
//! - W2 → R2 (fence to fence, through any row load that read a later writer's store):
//!   if any byte came from a later writer, that writer's W1 happens before R3, so R3
//!   reads W1 or a later stamp, never `s1`. The copy is discarded and the row redrawn.
//! - W0 (acquire of the predecessor's W3): a writer's stores are ordered after the
//!   previous row's, so no late byte of an old row lands in a new one.
//!
//! A sample reads its rows a block at a time (`Storage::read_block`): R1 of every
//! row of the block, then all their row loads, one R2, then R3 of each row. Each row
//! is still read R1, loads, R2, R3 in program order, which is all the two edges above
//! use: a row's loads between its R1 and the shared R2 are ordered by them as a lone
//! row's are, and the other rows' loads and stamp loads in between change nothing
//! about any one row's pairing. A row whose R1 fails is not copied; one whose R3
//! fails is dropped from the block's results and redrawn alone.
//!
//! Stamps only move forward: a 32-bit lap (wrapping, compared with wrap-aware
//! arithmetic) and a 30-bit in-place edit count. An ABA on a stamp needs a reader
//! suspended inside one row copy while the same slot is overwritten exactly a multiple
//! of 2^32 laps, or edited a multiple of 2^30 times: the classic seqlock caveat, at
//! widths no training run approaches within one copy.
//!
//! ## 2. Appenders wait for their exact predecessor (`storage/shard.rs`, `stamp.rs`)
//!
//! The appender of sequence number `seq` in a ring of `steps` steps waits until the
//! slot's stamp shows the row of `seq - steps` published (or empty for the first lap).
//! Exactly one appender has that predecessor, so two appenders are never inside one
//! slot, and W1 can be a plain store: no `lock cmpxchg` per row, which would drain the
//! store buffer and serialise the row writes of an extend. An appender never waits on a
//! later claim, so the oldest in-flight claim always progresses: no deadlock. With a
//! writer per shard (the recommended setup) no appender ever waits at all.
//!
//! ## 3. Appenders and editors (`storage/shard.rs`)
//!
//! An editor (`write_all`) rewrites a stored row in place, so it could race an
//! appender for a slot. Both sides announce themselves on one `occupancy` word per
//! shard with a read-modify-write (appenders in the low half, editors in the high
//! half); the word's modification order decides who saw whom. Plain appenders already
//! inside finish their one extend before an editor starts; appenders arriving while an
//! editor is inside mark slots by compare-exchange, as editors always do.
//!
//! ## 4. Cursors, floors and windows
//!
//! Whether a row is readable is decided by its stamp, and, while a stream writes it
//! or its next lap, by the stream's words (§6, "Streams"). The cursor orders one
//! thing: claims are AcqRel, so that an appender that claimed earlier is seen by a
//! later one's check that it is alone (§6). `empty()` raises the floor with Release after reading the cursor; a
//! learner loads the floor with Acquire before the cursor, so its window never starts
//! above its end.
//!
//! ## 5. Epochs without replacement (`sampler/without_replacement.rs`)
//!
//! An epoch is immutable once published through an `ArcSwap`; learners split it with
//! `fetch_add` on its cursor, so an entry is handed out once. The learner that finds
//! it exhausted sets `closed` (Release); the next sample sees it (Acquire) and starts
//! a new epoch under the turnover lock, re-checking that nobody did first.
//!
//! ## 6. The row copy is not a data race (`storage/atomic_copy.rs`)
//!
//! Readers copy rows that writers may be overwriting. A plain `memcpy` there is
//! undefined behaviour even if its result is discarded. Every access to row memory is
//! therefore atomic in the model: on x86_64 an inline-assembly loop of single 16-byte
//! SSE, 8/4/2/1-byte or `rep movsb` moves (opaque to the compiler, each a hardware
//! load or store that is atomic at least per byte); elsewhere, and under loom and the
//! sanitizers, one `AtomicU64` per word. x86 keeps the loads of a copy ordered before
//! R3, and a string store before the stamp store that follows it (Intel SDM vol. 3,
//! memory ordering of string operations).
//!
//! **Overlapping moves.** A copy that is not a whole number of moves ends with one
//! move of the range's last 16 (or 8, 4, 2) bytes, which covers bytes the move before
//! it already copied. A writer stores those bytes twice, with the same values, inside
//! the slot it holds: no reader can validate a copy taken between the two stores (the
//! slot is marked as being written throughout), and nothing outside the range is
//! touched. A reader loads them twice; if a writer changed them in between, the copy is
//! a mix of rows, which R3 already rejects, as it rejects any copy raced by a writer.
//!
//! **Fixed-length field copies.** An append copies a field of one length into many
//! rows (`atomic_copy::FieldCopy`): the moves for that length are chosen once (two
//! 1-, 2-, 4-, 8- or 16-byte moves, four or six 16-byte moves at fixed offsets, 64-byte
//! blocks of 16-byte moves then up to three 16-byte moves ending at the field's end,
//! or `rep movsb`), and each row's copy is those moves and no branch; on a CPU with
//! AVX, a field of 32 bytes up to the `rep movsb` threshold moves by 32-byte `vmovdqu`
//! loads and stores instead, the last ending at the field's end. The general copy of a
//! range uses the same 16-byte moves, found from its length. All are single hardware
//! stores inside an `asm!` block, overlapping only inside the field's range; the
//! argument above asks nothing of a store's width (it needs no store to be atomic as a
//! whole, only opaque to the compiler and a hardware access), so it holds for them
//! unchanged. The AVX block ends with `vzeroupper`, leaving no upper register state for
//! the SSE moves after it.
//!
//! **Several slots at once.** An append holds a small group of consecutive slots
//! (`storage/mod.rs`, `append_rows`, about 2 KiB of them): W0-W2 for every slot of the
//! group, then the rows' stores a field at a time, then W3 for every slot. Each slot's
//! row stores still fall between its own W1 and W3, which is all that §1 uses; a
//! reader that finds a slot of the group marked as being written waits or redraws,
//! as for one slot. The appender waits (W0) only on predecessors, claims of earlier
//! sequence numbers, while holding later ones, so §2's argument against deadlock is
//! unchanged.
//!
//! **Streaming appends.** An append of at least 512 KiB into a ring of at least 32 MiB
//! writes each field of 4 KiB or
//! more with non-temporal stores (`movntdq`, `atomic_copy::store_streaming`): whole
//! lines go to memory without being read first, and without evicting the cache. Each
//! is still a single hardware store, so the copy stays race-free in the model. But
//! x86 orders non-temporal stores with nothing: one may become visible before the
//! ordinary store of the slot's writing mark (W1) that precedes it, or after the
//! publishing store (W3) that follows it. Either would break the protocol: a reader
//! could copy new bytes under the old published stamp and validate them (R1 and R3
//! both see the old stamp), or see the new stamp before the bytes. So a streaming
//! group of rows is bracketed by two `sfence`s (`plan.rs`, `write_rows_streaming`):
//! the first makes the group's W1s visible before any of their rows' stores, the
//! second makes all of those visible before the W3s. The stamp protocol then holds as
//! for ordinary stores. Under loom and the sanitizers `store_streaming` is the
//! ordinary word copy, and the fences do nothing.
//!
//! **Streams: appends that mark no slot.** Marking a slot (W1) reads its line, and a
//! small row's slot is a line or three: for small rows those reads were half of an
//! append's time. So the only appender in a shard, writing at least 4 KiB of rows of
//! at most 4 KiB into a ring of at least 32 MiB, or into a smaller ring that holds at
//! least 64 such appends, streams instead (`Storage::stream_rows`): it announces its
//! rows in the shard's two stream words, sets each slot out whole in a stage in L1
//! (stamp already published, raw priority, row), and stores the stage: into a ring of
//! 32 MiB or more by non-temporal stores of its whole lines, which read nothing, and
//! into a smaller one by ordinary stores (`atomic_copy::store`), whose order x86
//! keeps but the argument below does not need:
//!
//! ```text
//! streamer:  S0 first = cursor.fetch_add(n, AcqRel); alone: occupancy is its own unit
//!            S1 StreamHi = first + n; StreamLo = first          (Relaxed)
//!            S2 fence(Release); sfence
//!               every slot's stores, stamps too, in any order      (non-temporal)
//!            S3 sfence; StreamLo = first + n                     (Release)
//!
//! reader:    R1  s1 = stamp.load(Acquire), published
//!            R1' seq not in StreamLo..StreamHi                   (Acquire loads)
//!                row loads
//!            R2  fence(Acquire)
//!            R2' seq + steps not in StreamLo..StreamHi           (Acquire loads)
//!            R3  s2 = stamp.load(Relaxed); whole iff s1 == s2
//! ```
//!
//! - A stamp a stream stored may be visible before its row's bytes. If R1 read one,
//!   S2 synchronises with R1 (a release fence, then a store an acquire load reads),
//!   so S1 happens before R1': it sees the stream's range and refuses the row; or a
//!   later value of the words: the stream's S3, which its stores happen before (the
//!   `sfence` makes them visible first), or a later stream's S1, which comes after
//!   S3 (one streamer at a time in a shard, ordered through the occupancy word).
//!   Either way all of the row's bytes are there.
//! - A stream overwriting a row during its copy marks no slot, so R3 may see the old
//!   stamp. But if a row load read the stream's store, S2 synchronises with R2 (as W2
//!   with R2), so S1 happens before R2': it sees the range, which holds the row's
//!   next lap, `seq + steps`, and refuses the copy; or S3 or later, and then the
//!   stream's stamp store happens before R3, which differs from `s1`. A row refused
//!   at R1' or R2' is busy, as a slot marked being written is: a sample redraws, a
//!   read by position waits.
//! - A block of rows read together (`Storage::read_block`) takes every row's R1, then
//!   loads each shard's stream words once and checks all of its rows against them
//!   (R1'), copies, fences once (R2), loads the words once more (R2') and takes every
//!   R3. The bullets above ask only that a row's R1' load come after its R1 and
//!   before its row loads, and its R2' load after R2 and before its R3: one load
//!   after all of a block's R1s is such a load for each of them. A load shared with a
//!   row whose R1 came after it would not be, so none is (the loom models of
//!   `torn_reads.rs` fail if the first load moves before the R1s, or if R2' reuses
//!   it). While no stream is announced the words hold an empty range, and the block
//!   skips the per-row checks.
//! - A stream never writes a slot whose previous row is still being written, which
//!   is what W0 gives an appender that marks slots. It is alone after its claim, and
//!   claims are AcqRel: every appender that claimed before it entered the shard before
//!   its own claim, so the check sees it, still inside (no stream then) or gone, its
//!   stores happening before its leave (Release) and so before the stream's.
//! - An appender that marks slots after a stream (it was not alone, or its append is
//!   small) waits at W0 for its predecessor published and then also for the stream
//!   words not to hold it (`stamp::begin_append_after`): a stamp the stream stored
//!   brings the stream's range with it, as at R1', so no late byte of the stream
//!   lands in the new row.
//! - A streamer into a ring past the caches gathers into two stages in turn, and
//!   stores the one it gathered before in parts while it gathers the next (a part
//!   after each field's rows): the stores of one stream interleave across stages and
//!   land in any order, which S2 and S3 bracket as they do a single stage's. The
//!   gather writes only the stages, private memory.
//! - The stage is private memory; the stores to the region are single hardware stores
//!   (`vmovntdq` of a line on CPUs with AVX-512, the loop ending with `vzeroupper` as
//!   the AVX block does, `movntdq` of 16 bytes elsewhere, and ordinary moves at a
//!   run's partial first and last lines), opaque to the compiler like every copy of
//!   this section.
//! - A streamer that dies (a process killed inside `extend`) leaves its range
//!   announced: readers refuse its rows and appenders of their next lap wait, until
//!   the lease's takeover or a recovery drops every row of it (`Stamp::dropped`, since
//!   a stamp may show a row published over old bytes) and ends the stream
//!   (`storage/recover.rs`). A stream that unwinds does the same for itself.
//! - Under loom a stream stores its slots by ordinary word stores, an even position's
//!   stamp before its row and an odd position's after it: the two orders non-temporal
//!   stores may land in, each of which one of the checks above must catch. Appends of
//!   two rows or more stream there and single rows do not, so the models cover both
//!   protocols.
//!
//! ## 7. Priorities (`sumtree/`, `core/priorities.rs`, `sampler/leaf_writes.rs`)
//!
//! A prioritized row's mass lives in a leaf word of its shard's tree block: the row's
//! whole 32-bit lap and an integer mass kept to 26 significant bits. Its raw priority
//! lives in its slot's header beside the stamp, in a word with the same whole lap (the
//! priority kept to 22 significant bits). The mass is `(p + eps)^alpha` times `2^s`,
//! rounded, where the exponent `s` is one per buffer, lowered when a mass would pass
//! the leaves' bound and raised when the total gets light (`sampler/mass_scale.rs`,
//! which also says for which probabilities "within 1%" holds). The rules (details in
//! `sumtree/tree.rs`):
//!
//! - A collector writes a row's raw word while it holds the slot (between W1 and W3),
//!   and sets the leaf after W3, by compare-exchange: a draw never lands on a row
//!   before it can be read, and a leaf already holding a newer lap is left alone.
//! - Or by a plain load and store, when nobody else can change those leaves
//!   meanwhile (`sumtree/tree.rs`, "Plain leaves"). Each shard counts its leaf
//!   changers in one word: collectors from before their claim until their leaves are
//!   set, updates, re-masses and clears while they run. A collector holding the
//!   shard's leaf turn (`storage/shard.rs`, "Leaf turns": taken after the claim,
//!   before W3; a collector of a later lap over the same positions waits for it before
//!   setting leaves) reads the count after W3 (a `SeqCst` read-modify-write), and
//!   again every few nodes while it finds others. Only itself: an
//!   older collector with leaves to set would be counted (it counted itself before
//!   claiming, so before this one claimed); an update counted after the read reads
//!   this collector's raw words (stored before the fence; a store-buffering handshake,
//!   the count read by read-modify-write under loom) and leaves the older row's leaf
//!   alone. A node whose leaves are all its own it sets whole: its sum entry first, by
//!   a plain store (the old leaves' mass is the entry's, exact while nobody else
//!   changes them), then its leaves, `Release`: whoever changes one of those leaves
//!   next read it, so its own change of the entry comes after. At the run's edges, a
//!   `SeqCst` fence after a node's leaves stands for the compare-exchanges before the
//!   entries over them are refreshed; after the whole nodes, one fence. Then the
//!   collector refreshes the min and max entries over its run's leaves (the trees'
//!   lowest level covers 256 leaves, `sumtree/tree.rs`, "Min and max trees") and the
//!   levels above: an update of a new row that refreshed one of those entries from
//!   siblings it read before their stores meets that refresh as any two refreshes
//!   meet, and the last to store has read every leaf the other stored before.
//! - Beside learners' updates, most of a collector's leaves can still be plain
//!   (`sumtree/tree.rs`, "Marked updates"). A shard's tree has four sets of marks, and
//!   the count a marking bit for each. An update takes the bit of a free set (a
//!   `fetch_or`: one holder at a time; with none free it counts itself as before),
//!   sets a bit in that set for each run of leaves it will change (256 leaves a run
//!   in a million; the sets follow the tree's levels in its block), then its set's
//!   bit in the shard's marks-set word (a `Release` `fetch_or`), and only then
//!   changes leaves; when done it clears its bit of the marks-set word, then its
//!   marks (`Release`), and then its bit of the count. A collector whose read of the
//!   count finds only itself and marking updates, and then each of their bits set in
//!   the marks-set word (`Acquire`: the marks of these updates, not a stale bit,
//!   since each bit's read-modify-writes of the count carry its last clear to it),
//!   stores plainly every node whose runs it finds marked in none of their sets
//!   (`Acquire` loads): no such update changes their leaves, or it cleared its mark
//!   after it did, and the clear carries its changes. Nodes marked it
//!   compare-exchanges, as it does every node when a marking update's bit of the
//!   marks-set word reads clear (marks not yet set, or being cleared) or anyone else
//!   is counted.
//! - An update acts only on a row whose stamp it read published with the generation
//!   the caller sampled. It then compare-exchanges the raw word, then the leaf, each
//!   requiring the row's lap: a row replaced since, however many laps later (up to the
//!   2^32 of the stamps' own wrap), shows another lap, and the update is dropped; it
//!   never lands on the new row. (If its raw word went in and the leaf then shows a
//!   newer lap, that row's writer stored its own raw word after it.) An in-place
//!   rewrite does not move the lap, and lets the update through: it changes no
//!   priority, so the outcome is that of the update coming just before it.
//! - The raw word is the truth; the leaf follows it. Raw before leaf in an update, and
//!   leaf before raw in a re-mass (which then compare-exchanges the leaf to the raw
//!   word's mass), all `SeqCst`: a re-mass that reads an update's leaf reads its raw
//!   word too. After its leaf's compare-exchange, an update loads the raw word again
//!   and follows it if another writer changed it. Leaves and raw words end agreeing.
//! - The mass function (the scale word `Global::MassScale`, whose epoch also counts
//!   changes of `alpha`) is read by every writer of leaves before it computes, and
//!   again after it writes; if it moved, the writer re-masses the leaves it wrote from
//!   their raw words, until it reads the same word twice. Whoever moves the word
//!   (`set_alpha` stores alpha first) then re-masses every leaf. A leaf written under an
//!   old word after that pass went by belongs to a writer whose second read comes later
//!   in the `SeqCst` order than the word's change: it sees the change and redoes the
//!   leaf. So a collector racing `set_alpha` never leaves a leaf of the old alpha, and
//!   a rescale leaves no leaf of the old scale. Old and new masses may sit side by side
//!   while a pass runs; each is within the leaves' bound, so sums never overflow.
//! - Sums are exact integers kept by `fetch_add` of each leaf change's exact delta
//!   (no drift, whatever the interleaving); min and max entries are recomputed from
//!   their children, stored by compare-exchange and verified, all `SeqCst`. A leaf
//!   that beats the entries above it climbs by `fetch_max` instead, and reads its
//!   child again after each: a climb carries a value, not the children, so a child
//!   that moved on meanwhile (the same leaf updated again by someone who found nothing
//!   to carry yet) makes the climber refresh that entry from its children.
//! - The refresh of an entry of the min and max trees' lowest level reads the 256
//!   leaves below it, as `SeqCst` loads, and where the CPU has AVX2 four at a time,
//!   one 32-byte load inside an `asm!` block (`sumtree/extremum.rs`). What the refresh
//!   needs of each load is a `SeqCst` load's: that it reads the leaf after the
//!   compare-exchange of the entry (or the fence) before it, so that of a leaf stored
//!   before the other side's `SeqCst` fence or read-modify-write and this side's
//!   compare-exchange, at least one side sees the other's write. On x86-64 a `SeqCst`
//!   load is an ordinary load (the stores and read-modify-writes carry the order), and
//!   so is the vector load: the block reads memory, so the compiler moves no access
//!   across it; each aligned word of it is read whole; and x86 orders a vector load
//!   after every locked instruction and fence before it, as it orders any load. The
//!   order among the four words of one load is not fixed, and no argument here needs
//!   one: each is about one leaf at a time. Loom and the sanitizer build
//!   (`replaybuf_atomic_copy`) take the scalar loads.
//! - A descent reads `Relaxed` and may see a parent and its children disagree; it
//!   clamps to a child with mass, and the sample keeps a draw only if the leaf it
//!   landed on has mass and its lap is the lap of the row the stamp shows. Otherwise it
//!   draws again. Where the CPU has AVX2 it reads a node four words at a time, one
//!   32-byte load inside an `asm!` block, and with AVX-512 eight at a time, one
//!   64-byte load (`sumtree/pick.rs`): as with §6's copies, the
//!   block is opaque to the compiler, so no racy plain access exists in the language's
//!   model, and the hardware reads each aligned word whole; a descent needs no more
//!   than a `Relaxed` load of each word gives it. Running totals that racing words
//!   wrap are caught like any other disagreement: the child named must leave the
//!   target at least its mass before, or the descent clamps.
//!
//! ## 8. Trajectory slices (`sampler/slice.rs`)
//!
//! A slice buffer keeps, per lane (one environment's column, or one ndim-1 ring), a
//! `tail`, a trajectory `count`, the last row's id and flags, and a table of
//! trajectory starts; each row's header holds its trajectory word. The rules:
//!
//! - An append whose first row is `s` waits until each lane's `tail` (Acquire) is
//!   `s`: it decides after the rows before it were decided and published, so a lane's
//!   bookkeeping is written by one appender at a time, in sequence order. It writes a
//!   new trajectory's table entry before publishing its first row, each row's
//!   trajectory word while it holds the slot (like a raw priority), and after its
//!   last W3 stores `count` and then `tail = s + steps`, both Release.
//! - A reader loads `tail`, then `count`, then table entries, all Acquire; it may see
//!   a count or a table entry newer than its tail. It clamps every trajectory to its
//!   live rows `lo..tail`, drops empty ones, and reads each row of a window with the
//!   slot protocol, `Want::Exact`, loading the trajectory word between R1 and R3. A
//!   row lapped since the pick, or one whose trajectory word names another trajectory
//!   (a table entry overwritten under the pick: entries only grow), fails the window,
//!   which is picked again whole.
//!
//! ## 9. The learner's pipeline (`transform.rs`, `prefetch.rs`, `max_value.rs`)
//!
//! - Transforms: a change builds a new list, stores it in the `ArcCell` (a whole value,
//!   old or new, for every reader), then stores the "any forward / any inverse" flags
//!   with Release; a sample loads its flag with Acquire before loading the list, so a
//!   set flag never comes with an older, emptier list. Changes are serialised by a
//!   mutex; samples never take it.
//! - Prefetch: the queue of ready batches, the free buffers, the busy count and the
//!   flags are all behind one facade mutex; a batch moves from a worker to the learner
//!   by being pushed and popped under it, which orders the worker's writes to the batch
//!   before the learner's reads. The condition variables only wake; every wait
//!   re-checks its condition under the lock.
//! - The max-value writer decides placements under its own mutex, and writes rows only
//!   through the slot protocol: appends as in sections 1-2, replacements as editors
//!   (section 3). Readers see nothing new.
//!
//! ## 10. Freezing, recovery and shared regions (`storage/freeze.rs`, `storage/recover.rs`, `shared/`)
//!
//! - A freeze (a checkpoint copying the region) takes each shard's freezer word by
//!   compare-exchange (one freezer at a time, across processes), sets the occupancy
//!   word's `FROZEN` bit, and waits until the word counts nobody inside; this
//!   process's priority updaters are held the same way by a word of its own. An
//!   appender or editor that finds `FROZEN` takes its unit back and waits. Both sides
//!   read-modify-write one word, so either the newcomer sees the freeze or the freezer
//!   sees the newcomer. The thaw's Release `fetch_and` pairs with the waiters' Acquire
//!   loads. Updates from other processes are not held: a loaded checkpoint's trees
//!   are rebuilt from its raw priorities, so a copy taken mid-update loads consistent.
//! - **The freeze rule: nobody waits for a thaw while counted inside a shard.** A
//!   freezer sets `FROZEN` on *every* shard before it waits for any to drain, so a
//!   writer counted in shard 0 that waited for shard 1 to thaw would wait for the
//!   freezer while the freezer waited for it. A write that spans shards (a
//!   buffer-level extend of an ndim-2 storage, `write_all`) tries each shard
//!   (`Shard::try_enter_append`, `try_enter_edit`), and on finding one frozen leaves
//!   every shard it entered, waits for the thaw, and starts over (`Storage::enter_all`).
//!   What it does once inside waits only on other writers that are inside (a slot's
//!   predecessor, an editor's plain appenders), never on a freezer. Checked by loom:
//!   `multi_shard_freeze.rs` (a two-shard extend and a two-shard `write_all` racing a
//!   freeze, an extend racing a swap: each hangs without the rule), and on hardware by
//!   `tests/never_stuck.rs` (32 shards, with a watchdog).
//! - A freeze whose process died (shared mode) is lifted by a waiter that first takes
//!   the freezer word over from the dead holder by compare-exchange, naming itself,
//!   then clears `FROZEN`, then gives the word back: while the word names a live
//!   process no new freezer can take it, so the bit cleared is never a new freeze's.
//! - Everything a region's writers change lives in the region (cursors, floors,
//!   occupancy, leases, the prioritized globals), so a region whose writers all died
//!   (a reopened file, a loaded checkpoint) is repaired by one pass with the region to
//!   itself: occupancy to zero, each shard's `Abandoned` word up to its cursor, leaves
//!   recomputed from raw priorities and the trees rebuilt, slice lanes closed. An
//!   appender whose predecessor row is below `Abandoned` takes the slot over whatever
//!   it holds (`Prev::Abandoned`) unless an editor is inside: no other appender can
//!   be, since everyone who claimed below was dead when the word moved, but editors
//!   rewrite any published row, those below `Abandoned` included, so the appender
//!   waits for an editor's mark to be published (or dropped, if the editor died) as
//!   it would for a predecessor.
//! - **The liveness rule (shared mode).** A process is alive while its process-table
//!   entry names it and the entry's byte of the region's file is locked with an
//!   open-file-description lock (`shared/liveness.rs`). It takes the lock before it
//!   claims the entry and releases it after giving the entry back; the kernel releases
//!   it when the process dies, whatever PID namespace it lives in. Pids and `/proc`
//!   start times are not consulted: across namespaces they name other processes.
//! - In a shared region only the lease holder of a shard appends to it (leases are
//!   taken and given back by compare-exchange on the shard's lease word, naming a
//!   process-table entry and its generation): a writer handle leases its shard, a
//!   buffer-level extend of an ndim-1 buffer one shard, and of an ndim-2 buffer every
//!   shard (or it is refused). Editors likewise hold the shard's `Editor` word, one
//!   process at a time, taken before the occupancy word is entered. So whatever a
//!   shard's occupancy counts, whatever is half written in it, belongs to its lease
//!   holder or its editor process; a process that finds the holder dead takes the word
//!   by compare-exchange and repairs the shard while others run. For a dead lease
//!   holder it clears the appender units (keeping editors and the freeze bit), moves
//!   `Abandoned` up (`fetch_max`, AcqRel), empties the leaves of rows never published
//!   (the trees' own compare-exchange), and closes the shard's lanes in the order an
//!   appender's turn ends (`count`, then `tail`, both Release). For a dead editor it
//!   clears the editor units and *drops* each row marked as being edited (a slot
//!   marked by an editor has edit count 1 or more, an appender's 0): a dropped stamp
//!   is neither written nor writing, readers leave it out, and the next lap's appender
//!   accepts it as its predecessor. Appenders, editors, freezers and reads by position
//!   that wait long on a slot or a shard look for such dead writers. Readers are
//!   untouched: they skip unpublished rows as always. Checked with real processes
//!   killed at random points (`tests/shared_crash.rs`), including a live writer in
//!   another PID namespace.
//! ## 11. Swaps (`swap/`, `storage/freeze.rs`)
//!
//! Every handle reaches the buffer's state (storage, sampler, write policy) through an
//! `ArcSwap` (a `Mutex<Arc<_>>` under loom). An operation loads it once, on the fast
//! path with no reference count, and uses that state to the end; a load after a
//! swap's `store` sees the new state, whose every field was written before the store.
//! A swap, under the buffer's reconfiguration lock:
//!
//! - holds the old policy's lock (a max-value writer's), then freezes the old storage:
//!   `fetch_or(FROZEN)` on every occupancy word and on the updaters' word, then
//!   Acquire loads until nobody is inside (section 3), so every write that entered
//!   before is published, and everything it wrote happens before the copy;
//! - copies the rows with the slot protocol's reads (nothing changes under them), or
//!   builds a second `Storage` over the same region;
//! - stores the new state, stores `retired = true` in the old storage (Release), and
//!   only then thaws (the `fetch_and` with Release of section 3).
//!
//! A writer (appender, editor, priority updater) that loaded the old state enters
//! with an AcqRel read-modify-write of the word the freeze and the thaw change, then
//! loads `retired` (Acquire). In that word's modification order its entry is either
//! before the freeze's `fetch_or` (the freeze waited for it: its rows are in the
//! copy), or it sees `FROZEN` and backs off, or it reads the thaw or later: then the
//! thaw synchronises with it, `retired = true` happens before its load, and it leaves
//! without writing and redoes the whole write on the state it loads next (the new
//! one: the store happened before the thaw too). A buffer-level ndim-2 extend enters
//! every shard before writing any (by the freeze rule of section 10), so it is copied
//! whole or redone whole. So a write racing a swap lands exactly once, in the storage
//! the buffer has after it. Samples need none of this: a sample that loaded the old
//! state reads the old storage, which nobody writes any more. The swap carries the
//! storage's counters (a sample call's random stream, a learner's stream, a writer's
//! shard) once the old storage is frozen, and a number taken from it after the copy
//! would be handed out again by the new one. A taker does not enter the storage (a
//! checkpoint's freeze would hold it up). It counts, and after a `SeqCst` fence reads
//! the storage's `carrying` flag; a copying swap sets the flag, and after a fence of
//! its own reads the counters (Dekker's pairing). A taker that finds the flag set, or
//! the storage retired, waits for the copy to end and takes its number again on the
//! new state (`Storage::take_count`).
//!
//! ## 12. Rate limits (`rate_limit/`)
//!
//! A heap buffer's limiter keeps its counts behind a mutex and its waiters on two
//! condition variables: the lock orders everything, and a waiter is notified by
//! whoever moves the counts, changes the limit or closes it. A shared region's limiter
//! (`rate_limit/shared.rs`) takes no lock another process could die holding: the
//! counts are two `SeqCst` words, a call judges them and then adds its rows, and a
//! sleeper waits on a futex word (`WAKE`) of the region. The handshake that keeps a
//! sleeper from missing a move is a store-buffering pair: the sleeper increments
//! `WAITERS` and then reads the counts; a mover adds its rows and then reads
//! `WAITERS`, bumping `WAKE` and waking if it is not zero. The total order of `SeqCst`
//! makes at least one of the two reads see the other's write: either the sleeper sees
//! the move, or the mover bumps `WAKE` after the sleeper read it, and the kernel (which
//! compares `WAKE` as it queues the sleeper) refuses the sleep or wakes it. A setter
//! and a closer always bump and wake, and a sleeper reads the limit (a seqlock) and
//! the flags again after reading `WAKE`. Loom models `SeqCst` as acquire-release, so
//! the two reads of the handshake are `fetch_add(0)` under loom
//! (`sync::handshake_load`), which a read-modify-write of the other word orders.
//!
//! ## 13. The FIFO sampler's mark (`sampler/fifo.rs`)
//!
//! A FIFO batch lists the rows from its shard's mark (`ShardWord::Popped`) on, reads
//! them as any sampler reads rows (stamps checked before and after the copy), and only
//! then moves the mark past them with a compare-and-swap from the value it listed
//! from. The mark orders nothing else, so both are `Relaxed`: the row data is ordered
//! by the stamps, and exclusivity comes from the compare-and-swap alone (of the
//! learners that listed the same rows, one moves the mark; the others fail and list
//! again from the new mark). Skipping rows that left the window is a `fetch_max`,
//! which never moves the mark back past rows another learner took.
//!
//! ## 14. A frames buffer's side slots (`storage/frames.rs`)
//!
//! A side slot (the next value of an episode's last step) is a small seqlock of its
//! own: its tag is the row's slot sequence plus one when whole, and `SIDE_TAKEN` while
//! an appender writes it. An appender takes the slot with a compare-and-swap from a
//! whole slot's tag (`Acquire`: the last holder's bytes, published by its `Release`
//! store of the tag, come before this one's), then a `Release` fence, the bytes
//! (atomic word stores, as any row copy, so §6 holds for them), and a `Release` store
//! of its tag. A reader loads the tag (`Acquire`), copies, fences (`Acquire`) and loads
//! the tag again: a copy that saw any byte of a later writer sees its `SIDE_TAKEN` or
//! its tag at the second load, and misses. Two appenders that come to one slot (their
//! side counts `slots` apart) write it in turn; before, both zeroed the tag and wrote
//! at once, and a reader took the mix under whichever tag was stored last (loom:
//! `two_appenders_ending_episodes_into_one_side_slot_write_it_in_turn`). An appender
//! that died holding a slot leaves it taken: the next one gives up after a wait (its
//! row misses) and the shard's recovery frees it.
//!
//! A shared restore and an attach meet the same way (§10): the restorer marks the
//! region and then reads the process table, the attacher joins the table and then
//! reads the mark, each with a `SeqCst` fence between its store and its load, so at
//! least one sees the other (`Storage::begin_restore`, `Storage::restoring`).
//!
//! ## What checks this
//!
//! - **loom** (`loom-tests/`, run by `.ci/run` with `LOOM_MAX_PREEMPTIONS=2`): the slot
//!   protocol (reader against lapping appenders; consecutive laps; editor against a
//!   compare-exchange appender), torn reads through the public API (sampling and reads
//!   by index while a collector laps a 2-slot ring), two collectors lapping each other
//!   on one shard, ndim-2 extends by environment group, `write_all` racing `extend`,
//!   and two learners sharing an epoch. Removing either fence of the slot protocol
//!   makes these fail. For priorities: a descent racing an update on a 4-leaf tree, a
//!   new row's leaves racing a stale update of the row it replaces, a stale update
//!   through the public API while a collector laps the ring, two collectors replacing
//!   the one row of a ring and an update racing a collector, with plain leaf stores
//!   allowed (the sums and masses end exact; these fail if a collector without the
//!   leaf turn does not wait for it, if a failed take gives the turn back, or if the
//!   count leaves updates out), two sibling updates
//!   under one min entry (which fails without the refresh's verification), other
//!   pairs of racing updates below one entry and up to the root, a climb whose own
//!   leaf another update raises meanwhile (which fails without the climb's reading
//!   of its child, at the leaf or at the level above), and
//!   `set_alpha` racing a collector's new row and an update (each leaf ends with its
//!   raw priority's mass under the last alpha; these fail if a collector does not
//!   check the mass function again after setting its leaves, or an update sets the
//!   leaf before the raw word). For
//!   slices: a window read racing a collector that laps it, and two collectors sharing
//!   a lane (which fails if an appender does not wait for its turn). For prefetch: the
//!   handoff of whole batches from a worker, a loader dropped with a batch in flight,
//!   an epoch's end handed over in its place, and an error made before the learner
//!   asked never handed over (removing the worker's wakeup makes these deadlock).
//!   For swaps: an extend racing a copy into a new storage, an in-place swap to an
//!   immutable writer, and two swaps in a row, each landing exactly once (these fail
//!   if an appender skips the retirement check, or a swap thaws before retiring); a
//!   `writer()` and a `sample()` racing a copy into a new storage take numbers the
//!   new storage does not hand out again (these fail if the counter is taken outside
//!   the storage).
//!   For rate limits, both limiters: an inserter and a sampler in lockstep, a waiter
//!   freed by closing and by a wider limit (the shared one deadlocks without
//!   `WAITERS`, or when a sleeper judges the limit it read before `WAKE`).
//! - **stress** (`tests/stress.rs`): writers (more than shards) and learners on tiny
//!   rings, every field derived from one counter, and learners updating priorities
//!   with the trees checked exact afterwards; also run by `scripts/sanitize` under
//!   ThreadSanitizer (with std rebuilt instrumented) and AddressSanitizer.
//!   `tests/swap_concurrent.rs` swaps samplers, policies and storages hundreds of
//!   times while collectors write and learners sample, then accounts for every row.
//! - **priorities' range and races** (`tests/prioritized_range.rs`): draw frequencies
//!   and mass ratios for priorities from 1e-8 to 1e8 (within 1%), a positive
//!   priority never massless, updates 65,536 laps late dropped, and `set_alpha`
//!   racing collectors and a learner, with every leaf checked against its raw
//!   priority afterwards.
//! - **fuzzing and properties** (`fuzz/`, `tests/model.rs`, `tests/sumtree.rs`):
//!   sequences of operations against the sequential model of `replaybuf::reference`, and
//!   tree operations against the locked twin in `sumtree/reference.rs`.
//!
//! Layer: base.
