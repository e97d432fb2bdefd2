"""A TCP relay the chaos harness controls (benches/chaos/harness.py): it listens on a loopback
port and forwards each connection to a target. Its mode makes the partitions:

* `pass`: forwards both ways;
* `blackhole`: new connections are accepted and never answered, bytes of existing ones are
  read and dropped in both directions (a peer that vanished: the sender sees nothing, no
  reset, until its own timeout); when the mode goes back to `pass`, every connection that
  lived through the blackhole is closed (its streams lost bytes, as a TCP connection whose
  retransmissions timed out);
* `refuse`: existing connections are closed and new ones are closed at once (a reset peer).

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
        self.conns = []  # [client_sock, upstream_sock or None, poisoned]
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", listen_port))
        self.srv.listen(512)
        self.port = listen_port
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{name}").start()

    def set_mode(self, mode):
        with self.lock:
            old, self.mode = self.mode, mode
            conns = list(self.conns)
        if mode == "refuse" or (old == "blackhole" and mode == "pass"):
            for c in conns:
                if mode == "refuse" or c[2]:
                    self._close(c)
        if mode == "blackhole":
            for c in conns:
                c[2] = True

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
                cs, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(cs,), daemon=True).start()

    def _serve(self, cs):
        with self.lock:
            mode = self.mode
        if mode == "refuse":
            cs.close()
            return
        c = [cs, None, mode == "blackhole"]
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

    def set_mode(self, mode):
        self.proc.stdin.write(mode + "\n")
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
        mode = line.strip()
        if mode in ("pass", "blackhole", "refuse"):
            relay.set_mode(mode)
    relay.stop()


if __name__ == "__main__":
    main()
