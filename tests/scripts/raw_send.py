# Sends one packet of each untranslated kind to DST4 / DST6 from raw
# sockets, then counts the "administratively prohibited" errors that come
# back (ICMP type 3 code 13, ICMPv6 type 1 code 1) for up to 2 s, and prints
# "prohibited N".
import select, socket, struct, sys, time
dst4, dst6 = sys.argv[1], sys.argv[2]

def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    s += s >> 16
    return ~s & 0xffff

err4 = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
err6 = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
sctp_init = bytes.fromhex("9c400050000000000000000001000014deadbeef00010000000a000a00000001")
socket.socket(socket.AF_INET, socket.SOCK_RAW, 132).sendto(sctp_init, (dst4, 0))
socket.socket(socket.AF_INET, socket.SOCK_RAW, 47).sendto(b"\0\0\x08\0" + b"\0" * 20, (dst4, 0))
ts = struct.pack("!BBHHHIII", 13, 0, 0, 9, 1, 1, 0, 0)
ts = ts[:2] + struct.pack("!H", csum(ts)) + ts[4:]
err4.sendto(ts, (dst4, 0))
socket.socket(socket.AF_INET6, socket.SOCK_RAW, 132).sendto(sctp_init, (dst6, 0))
# The kernel fills in the ICMPv6 checksum of raw ICMPv6 sockets.
err6.sendto(bytes([139, 0, 0, 0]) + b"\0" * 12, (dst6, 0))
print("sent", flush=True)
want, got, deadline = 5, 0, time.time() + 2
while got < want and time.time() < deadline:
    ready, _, _ = select.select([err4, err6], [], [], max(0, deadline - time.time()))
    for s in ready:
        data = s.recv(65535)
        if s is err4:
            ihl = (data[0] & 0x0f) * 4
            if data[ihl] == 3 and data[ihl + 1] == 13:
                got += 1
        elif data[0] == 1 and data[1] == 1:
            got += 1
print("prohibited %d" % got, flush=True)
