"""A kiln process for the Python tests (tests/interop/, tests/deploy/): started with its
stderr (kiln's logfmt lines) read on a thread, waited for until a line says it is ready,
stopped with SIGTERM (SIGKILL after 15 s).

    server = KilnProcess([kiln, "serve", "--port", "0", "--rest_api_port", "0", ...])
    server.rest, server.grpc        # from its event=server_started line ("http://127.0.0.1:PORT", "127.0.0.1:PORT")
    server.stop(); server.returncode
"""
import re
import subprocess
import threading

SERVER_STARTED = "event=server_started"


class KilnProcess:
    def __init__(self, args, ready=SERVER_STARTED, timeout=90, env=None):
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        self.rest = self.grpc = None
        seen = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line.rstrip("\n"))
                if ready and ready in line:
                    seen.set()
            seen.set()  # EOF: the process ended

        threading.Thread(target=read, daemon=True).start()
        if ready and (not seen.wait(timeout) or self.proc.poll() is not None):
            self.stop()
            raise AssertionError(f"{args[0]} {args[1] if len(args) > 1 else ''} did not start:\n" +
                                 "\n".join(self.log[-30:]))
        line = self.line(ready) if ready else None
        m = line and re.search(r"grpc=([\d.]+):(\d+) rest=([\d.]+):(\d+)", line)
        if m:
            self.grpc = f"{m.group(1)}:{m.group(2)}"
            self.rest = f"http://{m.group(3)}:{m.group(4)}"

    def line(self, marker):
        """The first log line containing `marker` (None when there is none yet)."""
        return next((entry for entry in self.log if marker in entry), None)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def returncode(self):
        return self.proc.returncode
