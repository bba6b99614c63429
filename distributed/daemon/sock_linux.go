package daemon

import (
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// control runs f on c's file descriptor; false when c has none.
func control(c net.Conn, f func(fd uintptr)) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	return err == nil && raw.Control(f) == nil
}

// peerCred returns "uid:pid" of the process at the other end of a Unix
// socket (SO_PEERCRED, as of connect), or "" when unknown.
func peerCred(c net.Conn) string {
	var cred *syscall.Ucred
	control(c, func(fd uintptr) {
		cred, _ = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if cred == nil {
		return ""
	}
	return strconv.FormatUint(uint64(cred.Uid), 10) + ":" + strconv.FormatInt(int64(cred.Pid), 10)
}

// unsent returns the bytes in c's send queue that the peer has not
// acknowledged (TIOCOUTQ): replies its receive buffer had no room for.
// ok is false when unknown.
func unsent(c net.Conn) (n int, ok bool) { return ioctlInt(c, syscall.TIOCOUTQ) }

// pending returns the bytes received on c and not read yet (FIONREAD).
func pending(c net.Conn) (n int, ok bool) { return ioctlInt(c, syscall.TIOCINQ) }

func ioctlInt(c net.Conn, req uintptr) (int, bool) {
	var v int32
	errno := syscall.EINVAL
	control(c, func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(&v)))
	})
	return int(v), errno == 0
}

// tcpMemPressure returns the host's TCP memory-pressure threshold in
// bytes (net.ipv4.tcp_mem, in pages), or 0 when unknown.
func tcpMemPressure() uint64 {
	return sysctlMiddle("/proc/sys/net/ipv4/tcp_mem") * uint64(os.Getpagesize())
}

// tcpRmemDefault returns the default TCP receive buffer in bytes
// (net.ipv4.tcp_rmem), or 0 when unknown.
func tcpRmemDefault() uint64 { return sysctlMiddle("/proc/sys/net/ipv4/tcp_rmem") }

// sysctlMiddle returns the middle one of the three numbers in the file at
// path, or 0.
func sysctlMiddle(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return 0
	}
	n, _ := strconv.ParseUint(f[1], 10, 64)
	return n
}
