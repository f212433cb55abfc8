"""The continuous runtime: a pipelined dataflow where checkpoint barriers flow with the
records (the seeds' asynchronous barrier snapshots), tasks in separate OS processes
connected by credit-based channels (:mod:`weir.runtime.continuous.channels`, wire format
in :mod:`weir.runtime.continuous.wire`)."""
