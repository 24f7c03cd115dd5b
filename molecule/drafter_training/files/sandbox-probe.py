"""What a process of the training job can reach: run inside its sandbox (systemd-run with the
installed unit's own settings), it reports as JSON which processes it sees (and whether it
can open their memory or their root), what it sees in /dev/shm, the markers it wrote to /tmp
and /dev/shm, and every path below / it may write (os.access: mode bits, ACLs and read-only
mounts alike). The play compares each with the host as root sees it."""

import json
import os
import stat
import sys

SKIP = ("/proc", "/sys")


def wrote_in(folder, marker):
    """Really write a file in ``folder`` (and remove it): os.access is not the same thing."""
    path = os.path.join(folder, f".{marker}-probe")
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return False
    # Created is written (a message queue folder takes no data, but a new queue is as good).
    os.close(descriptor)
    os.unlink(path)
    return True


def can_write_file(path):
    # Links and sockets are not storage: a link's own mode is always 0777, and a socket
    # (the journal's, D-Bus's) is written to by connecting, which it decides itself. A
    # terminal of its own account (a pseudo-terminal belongs to whoever opened it) is
    # its own.
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return False
    if path.startswith("/dev/pts/") and info.st_uid == os.getuid():
        return False
    return os.access(path, os.W_OK)


def writable_paths(marker):
    """Every folder it can create a file in (not below it) and every other file it can write."""
    found = []
    for root, dirs, files in os.walk("/", topdown=True, followlinks=False):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP]
        if wrote_in(root, marker):
            found.append(root)
            dirs[:] = []  # what is below a writable folder is that folder's
            continue
        found.extend(p for p in (os.path.join(root, f) for f in files) if can_write_file(p))
    return sorted(found)


def opens(path, mode):
    try:
        with open(path, mode):
            return True
    except OSError:
        return False


def main():
    marker = sys.argv[1]
    seen = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    # Processes of other accounts (the server's, root's): its own account's are its own.
    others = [pid for pid in seen if os.stat(f"/proc/{pid}").st_uid != os.getuid()]
    for folder in ("/tmp", "/dev/shm"):
        with open(os.path.join(folder, marker), "w") as handle:
            handle.write("probe\n")
    found = {
        "uid": os.getuid(),
        "pids_seen": seen,
        "pids_of_other_accounts": others,
        "mem_opened": [pid for pid in others if opens(f"/proc/{pid}/mem", "rb")],
        "root_entered": [pid for pid in others if os.access(f"/proc/{pid}/root/", os.X_OK)],
        "shm": sorted(os.listdir("/dev/shm")),
        "writable": writable_paths(marker),
    }
    # The /tmp marker stays (a private /tmp goes with the unit; the host's would keep it,
    # which the play checks); the /dev/shm one goes (the server's /dev/shm is the host's).
    os.unlink(os.path.join("/dev/shm", marker))
    print(json.dumps(found))


if __name__ == "__main__":
    main()
