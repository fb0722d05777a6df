"""What a task's stderr says about a Python traceback: the agent's rule for tasks that hang
after raising. Standard library only, Python >= 3.6."""

TRACEBACK_LINE = b"Traceback (most recent call last):"


class TracebackWatch:
    """Notices a task whose stderr ends with a complete Python traceback.

    MXNet workers that raise print the traceback and then block forever at interpreter exit;
    the agent treats such a task as failed once it has been silent and idle for a while.
    """

    NONE, INSIDE, COMPLETE = 0, 1, 2

    def __init__(self):
        self.state = self.NONE
        self.partial = b""
        self.last_line = b""
        self.mark_time = 0.0
        self.mark_cpu = 0.0

    def feed(self, data):
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()[-4096:]
        completed = False
        for line in lines:
            if line.startswith(TRACEBACK_LINE):
                self.state = self.INSIDE
            elif self.state == self.INSIDE:
                if line[:1] not in (b" ", b"\t") and line.strip():
                    self.state = self.COMPLETE
                    self.last_line = line[:500]
                    completed = True
            elif self.state == self.COMPLETE and line.strip():
                self.state = self.NONE
        return completed
