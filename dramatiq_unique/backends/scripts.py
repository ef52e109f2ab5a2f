"""The Lua scripts of :class:`~dramatiq_unique.backends.redis.RedisBackend`, and how they are called.

Every script shares the functions of ``lua/holders.lua``. Where the server has Redis Functions
(Redis 7 and Valkey), the library of them all is loaded once per server and each script is one
``FCALL``: the shared functions are defined once, at load, instead of in every call, which was
most of a lock script's server time. Elsewhere (Redis 6, or a user denied ``FUNCTION LOAD``)
each script is the shared functions followed by its own body, called by ``EVALSHA``. Both kinds
read and write the same keys and records, so processes of either kind, and of the previous
release, run side by side on one server.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from importlib import resources
from typing import Any

import redis

from ..forks import reset_in_child

#: The Lua file whose functions every script starts with.
_LIBRARY = "holders"

#: The flags a script declares in a comment of its own (``-- flags: no-writes``): a script
#: that changes nothing runs while the server is out of memory. One that frees
#: places runs out of memory too (``allow-oom``): a function that may write is otherwise refused
#: whole at maxmemory, where the same script called by EVALSHA ran, its first write a delete.
_FLAGS = re.compile(r"^-- flags: ([a-z-]+(?: [a-z-]+)*)$", re.MULTILINE)

#: What a server answers to FCALL of a function it does not have: it lost its functions (a
#: restart without persistence) or never had them (a cluster master that a slot moved to).
_NOT_LOADED = "function not found"

#: What a server answers to FUNCTION LOAD of a library it has (Redis 7, Valkey).
_LOADED = "already exists"


class LuaScripts:
    """The scripts of one backend, with its constants in front of the shared functions.

    Parameters:
      constants(dict[str, int | str]): The Lua constants the shared functions read, e.g.
        ``LINE_RETENTION``, defined in front of them.
    """

    def __init__(self, *, constants: dict[str, int | str]) -> None:
        lua = resources.files(__package__).joinpath("lua")
        # A text constant is written as JSON writes it, which Lua reads alike for printable ASCII.
        prelude = "".join(f"local {name} = {json.dumps(value)}\n" for name, value in constants.items())
        prelude += lua.joinpath(f"{_LIBRARY}.lua").read_text()
        self._bodies = {
            path.name.removesuffix(".lua"): path.read_text()
            for path in lua.iterdir()
            if path.name.endswith(".lua") and path.name != f"{_LIBRARY}.lua"
        }
        self._prelude = prelude
        # Named by its content: libraries of two releases never
        # replace each other's functions on a server both use.
        self.version = hashlib.sha1((prelude + "".join(sorted(self._bodies.values()))).encode()).hexdigest()[:12]
        self.library = f"dramatiq_unique_{self.version}"
        self.library_source = self._library_source()
        self._sources = {name: f"{prelude}\n{body}" for name, body in self._bodies.items()}
        self.shas = {name: hashlib.sha1(source.encode()).hexdigest() for name, source in self._sources.items()}

    def function(self, name: str) -> str:
        """The name of script ``name``'s function in the library."""
        return f"du_{self.version}_{name}"

    def source(self, name: str) -> str:
        """Script ``name`` as one chunk for EVAL: the shared functions, then its body."""
        return self._sources[name]

    def _library_source(self) -> str:
        # Each body becomes a function of KEYS and ARGV, so that it reads as the script it is
        # under EVALSHA; begin_call forgets what the previous call left in the library's state.
        parts = [f"#!lua name={self.library}\n", self._prelude]
        for name, body in sorted(self._bodies.items()):
            flags = "".join(f'"{flag}", ' for flag in _flags(body))
            parts.append(
                f"\nredis.register_function{{function_name = {self.function(name)!r}, flags = {{{flags}}},\n"
                f"callback = function(KEYS, ARGV)\nbegin_call()\n{body}\nend}}\n"
            )
        return "".join(parts)


def _flags(body: str) -> list[str]:
    found = _FLAGS.search(body)
    return found.group(1).split() if found else []


class ScriptCaller:
    """Calls the scripts on one client: ``FCALL`` when the server took the library, else
    ``EVALSHA``, chosen at the first call; a server that lost them gets them again.

    Parameters:
      scripts(LuaScripts): The scripts.
      client(redis.Redis | redis.RedisCluster): The client of the server or of the cluster.
    """

    def __init__(self, scripts: LuaScripts, client: Any) -> None:
        self.scripts = scripts
        self.client = client
        #: None until the first call: then whether the server runs the library.
        self.functions: bool | None = None
        self._choosing = threading.Lock()
        reset_in_child(self._reset_in_child)

    def _reset_in_child(self) -> None:
        # A thread of the parent may have been choosing, a round trip, at the fork.
        self._choosing = threading.Lock()

    def __call__(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` in one round trip; errors are redis-py's."""
        if self.functions is None:
            self._choose()
        if self.functions:
            try:
                return self._fcall(name, keys, args)
            except redis.ResponseError as e:
                if _NOT_LOADED in str(e).lower():
                    # The function never ran: load the library, and call again. On a cluster, on every
                    # master: the one that answered may not be the slot's owner in the client's map but
                    # the master a moving slot's key went to already (ASK), which redis-py does not name.
                    self.load()
                    return self._fcall(name, keys, args)
                if not _fcall_denied(e):
                    raise
                # An ACL lets this user load the library but not call it: EVALSHA from now on.
                self.functions = False
        try:
            return self.client.evalsha(self.scripts.shas[name], len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.client.script_load(self.scripts.source(name))  # on every master of a cluster
            return self.client.evalsha(self.scripts.shas[name], len(keys), *keys, *args)

    def pipeline_call(self, pipe: Any, name: str, keys: list[str], args: list[Any]) -> None:
        """Append a call of script ``name`` to ``pipe``, a pipeline of one server."""
        if self.functions is None:
            self._choose()
        if self.functions:
            pipe.fcall(self.scripts.function(name), len(keys), *keys, *args)
        else:
            pipe.evalsha(self.scripts.shas[name], len(keys), *keys, *args)

    def called_as(self, name: str) -> str:
        """What a call of script ``name`` names it by after FCALL or EVALSHA (as MONITOR shows
        it): its function, or its SHA."""
        return self.scripts.function(name) if self.functions else self.scripts.shas[name]

    def missing(self, reply: Any) -> bool:
        """Whether a pipeline's ``reply`` says that the server had not the script."""
        if isinstance(reply, redis.exceptions.NoScriptError):
            return True
        return isinstance(reply, redis.ResponseError) and _NOT_LOADED in str(reply).lower()

    def load_on(self, node: Any, name: str) -> None:
        """Give ``node``, a client of one server, the script ``name`` it lacked."""
        if self.functions:
            self.load(node)
        else:
            node.script_load(self.scripts.source(name))

    def load(self, node: Any = None) -> None:
        """Load the library on ``node``, a client of one server; by default on the client's
        server, or on every master of its cluster. A library of the same name is the same code:
        a server that has it already (another process loaded it) keeps it, and answers so in
        microseconds, where REPLACE would compile it again, the server blocked for a millisecond.
        A master of a cluster that does not answer is left out, unless none answers: the others
        serve their locks meanwhile, and it answers "Function not found" when it is back."""
        client: Any = self.client
        if node is not None:
            servers = [node]
        elif isinstance(self.client, redis.RedisCluster):
            servers = [client.get_redis_connection(primary) for primary in client.get_primaries()]
        else:
            servers = [client]
        unreachable: list[Exception] = []
        for server in servers:
            try:
                server.function_load(self.scripts.library_source)
            except redis.ResponseError as e:
                if _LOADED not in str(e).lower():
                    raise
            except (redis.ConnectionError, redis.TimeoutError) as e:
                unreachable.append(e)
        if unreachable and len(unreachable) == len(servers):
            raise unreachable[0]

    def _choose(self) -> None:
        with self._choosing:
            if self.functions is not None:
                return
            try:
                self.load()
            except redis.ResponseError as e:
                # Redis 6 has no FUNCTION; an ACL may deny it to this user; either way EVALSHA runs the same scripts.
                if not _refused(e):
                    raise
                self.functions = False
            else:
                self.functions = True

    def _fcall(self, name: str, keys: list[str], args: list[Any]) -> Any:
        function = self.scripts.function(name)
        if not isinstance(self.client, redis.RedisCluster) or not keys:
            return self.client.execute_command("FCALL", function, len(keys), *keys, *args)
        # redis-py would ask a node which keys an FCALL has (COMMAND GETKEYS), a round trip more:
        # they are known, and all share the first one's slot. A node named so is not tried again
        # by redis-py after a connection error, as it tries an EVALSHA: so it is here, with the
        # slot map read again, as often as the client's retry allows.
        for _ in range(_retries(self.client)):
            try:
                return self._fcall_at_slot(function, keys, args)
            except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterDownError):
                try:
                    self.client.nodes_manager.initialize()
                except RuntimeError:
                    # redis-py 5.0 reads its startup nodes while another thread's reading of the
                    # slot map changes them ("dictionary changed size during iteration"): the
                    # next try reads the map again.
                    pass
        return self._fcall_at_slot(function, keys, args)

    def _fcall_at_slot(self, function: str, keys: list[str], args: list[Any]) -> Any:
        client: Any = self.client
        node = client.get_node_from_key(keys[0])
        return client.execute_command("FCALL", function, len(keys), *keys, *args, target_nodes=node)


def _retries(client: Any) -> int:
    """How often ``client``, a RedisCluster, tries a command again after a connection error:
    its ``retry`` from redis-py 5.1 on, ``cluster_error_retry_attempts`` before."""
    retry = getattr(client, "retry", None)
    return int(retry.get_retries()) if retry is not None else int(getattr(client, "cluster_error_retry_attempts", 3))


def _fcall_denied(error: redis.ResponseError) -> bool:
    """Whether ``error`` is an ACL's refusal of the FCALL command itself (not of the keys)."""
    return _refused(error) and "'fcall'" in str(error).lower()


def _refused(error: redis.ResponseError) -> bool:
    """Whether ``error`` is the answer of a server without Redis Functions, or of one that does
    not let this user load them."""
    text = str(error).lower()
    return "unknown command" in text or "noperm" in text or "no permissions" in text or "unknown subcommand" in text
