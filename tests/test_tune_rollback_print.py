"""Issue 14: `tune rollback --print` for a journal made in a network namespace prints commands
that act on that namespace (`ip netns exec NAME` / `nsenter --net=PATH`), or refuses; pasted
into a root shell they must not change the host."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tuners.netns import enter_command, init_inode
from tuners.transaction import in_namespace
from wanprobe.errors import ConfigError


def test_host_journal_needs_no_prefix():
    assert enter_command(init_inode()) == []
    assert in_namespace("sysctl -w net.ipv4.tcp_rmem='4096 131072 6291456'", []) == \
        "sysctl -w net.ipv4.tcp_rmem='4096 131072 6291456'"


def test_named_namespace_prefixes_plain_commands_and_wraps_shell_syntax():
    enter = enter_command(12345, "lab-a")
    assert enter == ["ip", "netns", "exec", "lab-a"]
    assert in_namespace("ip link set dev eth0 mtu 1500", enter) == \
        "ip netns exec lab-a ip link set dev eth0 mtu 1500"
    loop = "for t in iptables ip6tables; do $t -t mangle -F WANPROBE; done"
    wrapped = in_namespace(loop, enter)
    assert wrapped.startswith("ip netns exec lab-a sh -c '") and "for t in" in wrapped
    heredoc = "nft -f - <<'EOF'\ntable inet wanprobe\nEOF"
    assert in_namespace(heredoc, enter).startswith("ip netns exec lab-a sh -c ")
    assert in_namespace("# a comment", enter) == "# a comment"


def test_unknown_namespace_is_refused():
    inodes = {os.stat(f"/proc/{p}/ns/net").st_ino for p in os.listdir("/proc") if p.isdigit()
              and os.path.exists(f"/proc/{p}/ns/net")}
    gone = max(inodes) + 7919  # no process and no /run/netns entry has it
    with pytest.raises(ConfigError, match="run `wanprobe tune rollback` inside it"):
        enter_command(gone)


@pytest.mark.netns
def test_unnamed_namespace_held_by_a_process_uses_nsenter():
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare(1)")
    holder = subprocess.Popen([unshare, "--net", "sleep", "30"])
    try:
        path = f"/proc/{holder.pid}/ns/net"
        for _ in range(100):  # until unshare has exec'd sleep in the new namespace
            if os.stat(path).st_ino != init_inode():
                break
            subprocess.run(["sleep", "0.02"])
        inode = os.stat(path).st_ino
        assert inode != init_inode()
        enter = enter_command(inode)
        assert enter[0] == "nsenter" and enter[1].startswith("--net=/proc/")
        assert os.stat(enter[1].split("=", 1)[1]).st_ino == inode
    finally:
        holder.kill()
        holder.wait()
