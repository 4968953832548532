"""Read-only collectors: sysfs, procfs, netlink and ioctl readers. Nothing here writes."""
