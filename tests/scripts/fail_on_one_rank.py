"""Rank 1 raises while rank 0 waits for it: the abort hook must end every rank."""

from hilbert_hpc.distributed.mpi import abort_on_exception, world

comm = world()
abort_on_exception(comm)
if comm.Get_rank() == 1:
    raise RuntimeError("injected failure on rank 1")
comm.recv(source=1)  # would wait forever without the abort
