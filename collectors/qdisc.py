"""Root and child qdiscs per device over rtnetlink (pyroute2 ``IPRoute.get_qdiscs``): kind,
handle and parent as ``tc qdisc show`` prints them (``"1:"``, ``"root"``), plus the per-qdisc
``bytes``/``packets``/``drops``/``overlimits`` from ``TCA_STATS`` when present.
"""

from __future__ import annotations

from collectors.sample import CollectError

SOURCE = "qdisc"
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1


def format_handle(handle: int) -> str:
    """``0x00010000`` → ``"1:"``, ``0x00010002`` → ``"1:2"`` (tc's ``print_tc_classid``)."""
    if handle == TC_H_ROOT:
        return "root"
    if handle == TC_H_INGRESS:
        return "ingress"
    major, minor = handle >> 16, handle & 0xFFFF
    return f"{major:x}:" if minor == 0 else f"{major:x}:{minor:x}"


def qdiscs_from_messages(msgs, names_by_index: dict[int, str]) -> dict[str, list[dict]]:
    """Pure conversion of pyroute2 ``tcmsg`` objects to ``{ifname: [qdisc, ...]}``."""
    out: dict[str, list[dict]] = {}
    for msg in msgs:
        ifname = names_by_index.get(int(msg["index"]), str(msg["index"]))
        entry = {"kind": msg.get_attr("TCA_KIND"), "handle": format_handle(int(msg["handle"])),
                 "parent": format_handle(int(msg["parent"]))}
        stats = msg.get_attr("TCA_STATS")
        if stats:
            for key, out_key in (("drop", "drops"), ("overlimits", "overlimits"),
                                 ("bytes", "bytes"), ("packets", "packets")):
                if key in stats:
                    entry[out_key] = int(stats[key])
        out.setdefault(ifname, []).append(entry)
    return out


def read_qdiscs(names_by_index: dict[int, str], ipr=None) -> tuple[dict[str, list[dict]], list]:
    """Dump all qdiscs of the caller's namespace."""
    try:
        if ipr is not None:
            return qdiscs_from_messages(ipr.get_qdiscs(), names_by_index), []
        from pyroute2 import IPRoute

        with IPRoute() as own:
            return qdiscs_from_messages(own.get_qdiscs(), names_by_index), []
    except Exception as exc:
        return {}, [CollectError(SOURCE, "rtnetlink RTM_GETQDISC", f"failed: {exc}")]


def qdiscs_from_raw(rows: list[dict], names_by_index: dict[int, str]) -> dict[str, list[dict]]:
    """Pure conversion of :func:`collectors.rtnl_raw.dump_qdiscs` rows (same output as
    :func:`qdiscs_from_messages`)."""
    out: dict[str, list[dict]] = {}
    for row in rows:
        ifname = names_by_index.get(row["ifindex"], str(row["ifindex"]))
        entry = {"kind": row["kind"], "handle": format_handle(row["handle"]),
                 "parent": format_handle(row["parent"])}
        for key in ("drops", "overlimits", "bytes", "packets"):
            if row.get("stats") and key in row["stats"]:
                entry[key] = row["stats"][key]
        out.setdefault(ifname, []).append(entry)
    return out


def read_qdiscs_raw(names_by_index: dict[int, str], sock=None) -> tuple[dict[str, list[dict]], list]:
    """Same as :func:`read_qdiscs` over the raw-socket reader."""
    from collectors.rtnl_raw import dump_qdiscs

    try:
        return qdiscs_from_raw(dump_qdiscs(sock), names_by_index), []
    except (OSError, ValueError) as exc:
        return {}, [CollectError(SOURCE, "rtnetlink RTM_GETQDISC", f"failed: {exc}")]
