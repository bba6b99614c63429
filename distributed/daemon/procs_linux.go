package daemon

import (
	"encoding/binary"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

// peerPIDs returns, for each of conns (TCP connections accepted from a
// local address), the id of the process holding the client's end; 0 when
// unknown: not found, or in a process of another user whose descriptors
// this one may not read. It finds each client socket's inode in the
// kernel's socket table (sock_diag: one exact look-up each, however many
// sockets the host has), then looks for the inode among the open files
// of the processes of hint first, then, if full, of every process: a
// full scan costs a few milliseconds on a host of a hundred processes,
// more with more open files, so call it rarely. It gives up at deadline,
// leaving the processes not found yet unknown.
func peerPIDs(conns []net.Conn, hint []int, full bool, deadline time.Time) []int {
	pids := make([]int, len(conns))
	want := map[string]int{} // "socket:[inode]" -> index in conns
	if fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag); err == nil {
		for i, c := range conns {
			if ino := clientInode(fd, c); ino != 0 {
				want["socket:["+strconv.FormatUint(uint64(ino), 10)+"]"] = i
			}
		}
		syscall.Close(fd)
	}
	left := len(want)
	look := func(pid int) {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
		fds, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, fd := range fds {
			link, err := os.Readlink(dir + fd.Name())
			if i, ok := want[link]; err == nil && ok && pids[i] == 0 {
				pids[i] = pid
				if left--; left == 0 {
					return
				}
			}
		}
	}
	for _, pid := range hint {
		if left > 0 && pid > 0 {
			look(pid)
		}
	}
	if left == 0 || !full {
		return pids
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if left == 0 || time.Now().After(deadline) {
			break
		}
		if pid, err := strconv.Atoi(p.Name()); err == nil {
			look(pid)
		}
	}
	return pids
}

// netlinkSockDiag is NETLINK_SOCK_DIAG, and sockDiagByFamily
// SOCK_DIAG_BY_FAMILY, of linux/sock_diag.h.
const (
	netlinkSockDiag  = 4
	sockDiagByFamily = 20
)

// clientInode returns the inode of the client end of c, a TCP connection
// from a local address, looked up through the sock_diag socket fd
// (inet_diag_req_v2 for that one socket: its addresses and ports, no
// cookie); 0 when not found.
func clientInode(fd int, c net.Conn) uint32 {
	l, lok := c.LocalAddr().(*net.TCPAddr)
	r, rok := c.RemoteAddr().(*net.TCPAddr)
	if !lok || !rok {
		return 0
	}
	family, src, dst := byte(syscall.AF_INET6), r.IP.To16(), l.IP.To16()
	if r4, l4 := r.IP.To4(), l.IP.To4(); r4 != nil && l4 != nil {
		family, src, dst = syscall.AF_INET, r4, l4
	}
	var req [72]byte // nlmsghdr (16), inet_diag_req_v2 (8 and a sockid of 48)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	req[16], req[17] = family, syscall.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[20:], ^uint32(0)) // every state
	binary.BigEndian.PutUint16(req[24:], uint16(r.Port))
	binary.BigEndian.PutUint16(req[26:], uint16(l.Port))
	copy(req[28:44], src)
	copy(req[44:60], dst)
	binary.NativeEndian.PutUint64(req[64:], ^uint64(0)) // INET_DIAG_NOCOOKIE
	if syscall.Sendto(fd, req[:], 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}) != nil {
		return 0
	}
	var resp [512]byte
	n, _, err := syscall.Recvfrom(fd, resp[:], 0)
	// nlmsghdr, then inet_diag_msg: 4 bytes, the sockid, expires,
	// rqueue, wqueue, uid, inode.
	if err != nil || n < 88 || binary.NativeEndian.Uint16(resp[4:]) != sockDiagByFamily {
		return 0
	}
	return binary.NativeEndian.Uint32(resp[84:])
}
