# Prints "seen KIND SRC" for every packet of the untranslated kinds the
# fail-closed test sends: SCTP and GRE (IPv4), SCTP (IPv6), ICMP timestamp
# requests and ICMPv6 node information queries.
import select, socket, sys
socks = {
    socket.socket(socket.AF_INET, socket.SOCK_RAW, 132): "sctp4",
    socket.socket(socket.AF_INET, socket.SOCK_RAW, 47): "gre4",
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP): "icmp4",
    socket.socket(socket.AF_INET6, socket.SOCK_RAW, 132): "sctp6",
    socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6): "icmp6",
}
print("ready", flush=True)
while True:
    ready, _, _ = select.select(list(socks), [], [])
    for s in ready:
        data, addr = s.recvfrom(65535)
        kind = socks[s]
        if kind == "icmp4":
            ihl = (data[0] & 0x0f) * 4
            if data[ihl] != 13:  # timestamp request only
                continue
            kind = "timestamp4"
        if kind == "icmp6":
            if data[0] != 139:  # node information query only
                continue
            kind = "nodeinfo6"
        print("seen %s %s" % (kind, addr[0]), flush=True)
