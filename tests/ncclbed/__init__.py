"""A CPU test bed that behaves like NCCL, for the analyzer's NCCL scenarios.

No machine here has two GPUs, and NCCL refuses two ranks on one GPU, so the analyzer's
NCCL rules are tested on real multi-process jobs whose collectives keep NCCL's
semantics while gloo moves the bytes:

* every rank is two processes: the **host** (the user's Python program, which calls
  ``torch.distributed`` as it would on NCCL) and its **device** (what the GPU and
  ProcessGroupNCCL's C++ threads are: a stream that runs the ops in issue order, a
  watchdog, a heartbeat monitor that dumps). They talk through a pipe; a host thread
  that holds the GIL stops the host, never the device.
* ``init_process_group("fakenccl")`` (:mod:`.backend`) installs a Python process group
  whose calls **return at once**: the op is recorded (the flight-recorder entry is made
  on the calling thread, at enqueue, with its stack) and queued on the device. A rank
  blocks only at a host sync (:func:`.backend.synchronize`, what ``.item()`` or
  ``torch.cuda.synchronize()`` are on a GPU) or in ``barrier`` (NCCL's barrier syncs
  the device).
* the device (:mod:`.device`) runs its queue in order on one stream thread: compute
  kernels (a sleep), collectives and send/recv on gloo groups of the devices, so an op
  **completes only when every member's queue has reached it**. ``batch_isend_irecv``
  is coalesced as NCCL does it: one ``p2p_seq_id`` per batch, per-op entries without
  events (they stay ``scheduled`` for ever) and one ``nccl:coalesced`` entry that owns
  the batch's events.
* the flight recorder (:mod:`.recorder`) writes **PyTorch's NCCL dump schema** (format
  2.10): entry states derived from events as NCCL does (``scheduled`` / ``started``
  only with timing on / ``completed``, ``retired`` by the watchdog every 100 ms),
  ``pg_status`` frontiers (last enqueued, started, completed: an assignment, in the
  counter the work used), ``pg_config``; full or active-only, pickle (with stacks, or
  without when the host holds the GIL) or the JSON an NVRx-style collector writes.
* faults modelled on real GPU failures (:mod:`.backend`): a device that stops with a
  sticky error (the stream halts at a faulting kernel; event queries fail from then
  on, so the watchdog retires nothing more and ops the device finished in its last
  interval stay pending for ever; the host goes on issuing until its next sync, which
  raises), a Python thread that holds the GIL (a long C-level call), a skipped
  collective, a skipped pipeline recv, a slow rank, a hung main thread.

Where it differs from real NCCL (also in ``docs/nccl_bed.md``): gloo, not NCCL kernels,
moves the data (an op whose ranks disagree on its kind or size may fail in gloo where
NCCL would hang or corrupt; scenarios avoid them); one stream per rank, so p2p ops are
serialised with the collectives (NCCL's eager-init mode; lazy init gives every peer pair
its own stream); communicators are created eagerly at group creation; stacks are
symbolised at enqueue, not at dump time; times are CPU times of two processes on one
machine.
"""
