"""kvpool.rpc: moves `kvpool.protocol` frames over TCP, or a Unix socket on the same host. It
knows no service.

Layer: imports `kvpool.protocol`, `kvpool.errors`, `kvpool.config`; never a service package
(master, transfer, client, ...). A service hands the server its request union and a handler,
and hands the clients its response union.

```
 RpcClient (sync, thread-safe) ─┐                     ┌─ RpcServer (asyncio Protocol, uvloop)
 AsyncRpcClient (asyncio)  ─────┼── frames over TCP ──┤    handler(request, conn) -> reply
                                │   or abstract Unix  │    or awaitable of a reply (a task)
                                │   Hello / Welcome   │  ServerThread: a server on its own loop
                                └── request ids ──────┘
```

Transport: every client dials TCP; when the `Welcome` names the server's abstract Unix socket
(the server listens on one unless ``unix=False``), a client on the same host moves to it after a
second handshake and keeps TCP on any failure (``unix=False`` or ``KVPOOL_RPC_UNIX=0`` keep it
on TCP). Behaviour is identical on both; the Unix round trip is cheaper.

Modules:

* `server`: `RpcServer`: listeners (TCP, abstract Unix), connection caps, the handshake and
  idle sweep; the loop that runs it owns all of its state.
* `connection`: `Connection` (what a handler sees): the handshake, coalesced writes,
  back-pressure (a peer that does not read, or has ``max_inflight`` requests running, is not
  read further), error replies for bad input.
* `client`: `RpcClient`, pipelined across threads with a leader/follower reader (no thread of
  its own); `call`, `call_many`, `call_as`. Idle connections are checked before use and a
  forked child connects anew.
* `connector`: `Connector`, how a client opens a connection (TCP, TLS, the handshake and its
  proof, the deposed-leader check, the move to the Unix socket); `parse_address`.
* `channel`: `Channel`, one client connection's socket and calls in flight; `Sent`.
* `aio`: `AsyncRpcClient`, the same calls as coroutines.
* `thread`: `ServerThread`, anything `Serving` (an `RpcServer`, the master) in a background
  thread on its own loop (tests, embedding the master).
* `loop`: `new_event_loop()` / `run()`, uvloop when installed.
* `bench`: the generic round-trip benchmark every RPC service can reuse.

Faults versus outcomes: a connection fault is `RpcError` (RPC_FAIL / RPC_TIMEOUT) and the next
call reconnects; an `ErrorReply` raises the exception for its code; service outcomes are fields
of the service's replies and are never raised here. A handler that raises a kvpool exception
answers with that exception's code; any other exception answers INTERNAL_ERROR and is logged.

Measurements and the reasons behind the client's design: docs/parts/perf-rpc.md.
"""

from kvpool.rpc.aio import AsyncRpcClient
from kvpool.rpc.client import RpcClient, parse_address
from kvpool.rpc.loop import new_event_loop, run
from kvpool.rpc.server import Connection, RpcServer
from kvpool.rpc.thread import ServerThread, Serving

__all__ = [
    "AsyncRpcClient",
    "Connection",
    "RpcClient",
    "RpcServer",
    "ServerThread",
    "Serving",
    "new_event_loop",
    "parse_address",
    "run",
]
