"""Keep an engine binary (``llama-server``, a parallel launcher) on its lease.

``python -m letsinfer.engines.keeper -- ARGV...`` runs ARGV as its child and
stays beside it: SIGTERM/SIGINT are passed on, the child's exit status becomes
the keeper's, and when the agent stops renewing the lease (see
engines/lease.py) the keeper stops the child and exits 3. Our own launcher for
the bundled engine watches its lease itself; a binary we did not write cannot,
so it runs under a keeper. The child dies with the keeper (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
import sys

from letsinfer.engines.lease import LeaseWatch

LEASE_LOST = 3
_PR_SET_PDEATHSIG = 1
_STOP = {signal.SIGTERM, signal.SIGINT}
_CHILD_STOP_S = 10.0


def _child_setup() -> None:  # in the child, between fork and exec
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP)  # the mask survives exec
    # SIGKILL, not SIGTERM: the keeper stops its child itself on every way out
    # it takes, so a keeper that is gone was killed, and the agent is starting
    # a fresh engine. An engine told to stop gently (llama-server's graceful
    # shutdown) could keep its clients' connections open without answering;
    # killed, its sockets close at once and the gateway retries elsewhere.
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _stop(child: subprocess.Popen[bytes]) -> int:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=_CHILD_STOP_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m letsinfer.engines.keeper -- ARGV...", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP)  # only sigtimedwait below sees them
    lease = LeaseWatch.from_environment()  # taken out of the child's environment
    child = subprocess.Popen(argv[2:], stdin=subprocess.DEVNULL, preexec_fn=_child_setup)
    while True:
        got = signal.sigtimedwait(_STOP, 0.5)
        code = child.poll()
        if code is not None:
            return code if code >= 0 else 128 - code
        if got is not None:
            return _stop(child)
        if lease.lost():
            print(
                f"letsinfer: no agent renewed this engine's lease for {lease.grace_s:g}s; "
                "stopping it",
                file=sys.stderr,
                flush=True,
            )
            _stop(child)
            return LEASE_LOST


if __name__ == "__main__":
    sys.exit(main(sys.argv))
