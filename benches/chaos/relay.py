"""A TCP relay the chaos harness controls (benches/chaos/harness.py): it listens on a loopback
port and forwards each connection to a target. Its mode makes the partitions:

* `pass`: forwards both ways;
* `blackhole`: new connections are accepted and never answered, bytes of existing ones are
  read and dropped in both directions (a peer that vanished: the sender sees nothing, no
  reset, until its own timeout); when the mode goes back to `pass`, every connection that
  lived through the blackhole is closed (its streams lost bytes, as a TCP connection whose
  retransmissions timed out);
* `refuse`: existing connections are closed and new ones are closed at once (a reset peer).

A mode applies to every client (`MODE`) or to the connections of one instance only
(`src SLOT MODE`; the instance's PID given by `pid SLOT PID`): the relay tells which process
opened a connection by its socket's inode (/proc/net/tcp, then /proc/PID/fd of that
instance), so one relay per backend (or Redis Cluster node) cuts one instance off it while
the others reach it, as one relay per instance-to-backend path would. A connection whose
instance has a mode of its own follows that mode; the others follow the relay's.
The lookup runs only while some instance has a mode of its own.

Each relay runs in a process of its own (`RelayProcess`: `python3 relay.py NAME LISTEN
TARGET`, its mode a line on its stdin), so that it does not stall with the harness's
client and snapshot threads when the machine starves.

Python stdlib only (threads and select).
"""
import os
import select
import socket
import subprocess
import sys
import threading


class Relay:
    def __init__(self, listen_port, target_port, name):
        self.name = name
        self.target = ("127.0.0.1", target_port)
        self.mode = "pass"
        self.lock = threading.Lock()
        self.conns = []  # [client_sock, upstream_sock or None, poisoned, slot (None: unknown or not looked up)]
        self.src_modes = {}  # instance slot -> its own mode (absent: the relay's)
        self.pids = {}  # instance slot -> pid
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", listen_port))
        self.srv.listen(512)
        self.port = listen_port
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{name}").start()

    def set_mode(self, mode, slot=None):
        """The relay's mode, or (`slot` given) the mode of one instance's connections."""
        with self.lock:
            if slot is None:
                old, self.mode = self.mode, mode
            else:
                old = self.src_modes.get(slot, self.mode)
                if mode == "pass":
                    self.src_modes.pop(slot, None)
                else:
                    self.src_modes[slot] = mode
            conns = list(self.conns)
        if slot is not None:
            if mode != "pass":
                self._classify(conns)
            conns = [c for c in conns if c[3] == slot]
        else:
            conns = [c for c in conns if c[3] not in self.src_modes]
        if mode == "refuse" or (old == "blackhole" and mode == "pass"):
            for c in conns:
                if mode == "refuse" or c[2]:
                    self._close(c)
        if mode == "blackhole":
            for c in conns:
                c[2] = True

    def _classify(self, conns):
        """Sets the instance slot of each connection not looked up yet."""
        todo = [c for c in conns if c[3] is None and len(c) > 4]
        if not todo:
            return
        inodes = self._inodes({c[4] for c in todo})
        owner = {}
        for slot, pid in list(self.pids.items()):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    owner[link[8:-1]] = slot
        for c in todo:
            ino = inodes.get(c[4])
            if ino is not None:
                c[3] = owner.get(ino)

    def _inodes(self, ports):
        """Client port -> socket inode of the client's side of each connection to this relay."""
        res = {}
        mine = f"{self.port:04X}"
        try:
            with open("/proc/net/tcp") as f:
                next(f)
                for line in f:
                    p = line.split()
                    lport, rport = int(p[1].split(":")[1], 16), p[2].split(":")[1]
                    if rport == mine and lport in ports:
                        res[lport] = p[9]
        except (OSError, ValueError, IndexError, StopIteration):
            pass
        return res

    def _mode_of(self, c):
        with self.lock:
            if not self.src_modes:
                return self.mode
        if c[3] is None:
            self._classify([c])
        with self.lock:
            return self.src_modes.get(c[3], self.mode)

    def _close(self, c):
        for s in c[:2]:
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        with self.lock:
            if c in self.conns:
                self.conns.remove(c)

    def _accept(self):
        while not self.stopped:
            try:
                cs, peer = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(cs, peer[1]), daemon=True).start()

    def _serve(self, cs, peer_port):
        c = [cs, None, False, None, peer_port]
        mode = self._mode_of(c)
        if mode == "refuse":
            cs.close()
            return
        c[2] = mode == "blackhole"
        with self.lock:
            self.conns.append(c)
        if mode != "blackhole":
            try:
                us = socket.create_connection(self.target, timeout=2)
                us.settimeout(None)
            except OSError:
                self._close(c)  # the target is down: the client sees its connection closed
                return
            c[1] = us
        try:
            while True:
                socks = [s for s in c[:2] if s is not None]
                if not socks:
                    return
                r, _, _ = select.select(socks, [], [], 0.5)
                if c[0].fileno() < 0:
                    return
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        self._close(c)
                        return
                    if c[2] or c[1] is None:
                        continue  # blackholed: dropped
                    other = c[1] if s is c[0] else c[0]
                    other.sendall(data)
        except (OSError, ValueError):
            self._close(c)

    def stop(self):
        self.stopped = True
        try:
            self.srv.close()
        except OSError:
            pass
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            self._close(c)


class RelayProcess:
    """A `Relay` in a child process, with the same `port`, `set_mode` and `stop`."""

    def __init__(self, listen_port, target_port, name):
        self.name = name
        self.port = listen_port
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), name, str(listen_port), str(target_port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"relay {name} did not start")

    def set_mode(self, mode, slot=None):
        self.proc.stdin.write((mode if slot is None else f"src {slot} {mode}") + "\n")
        self.proc.stdin.flush()

    def set_pid(self, slot, pid):
        self.proc.stdin.write(f"pid {slot} {pid}\n")
        self.proc.stdin.flush()

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main():
    name, listen, target = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    relay = Relay(listen, target, name)
    print("ready", flush=True)
    for line in sys.stdin:
        w = line.split()
        if len(w) == 1 and w[0] in ("pass", "blackhole", "refuse"):
            relay.set_mode(w[0])
        elif len(w) == 3 and w[0] == "src" and w[2] in ("pass", "blackhole", "refuse"):
            relay.set_mode(w[2], int(w[1]))
        elif len(w) == 3 and w[0] == "pid":
            with relay.lock:
                relay.pids[int(w[1])] = int(w[2])
    relay.stop()


if __name__ == "__main__":
    main()
