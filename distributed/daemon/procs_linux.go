package daemon

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// peerPIDs returns, for each of conns (TCP connections accepted from a
// local address), the id of the process holding the client's end; 0 when
// unknown: not found, or in a process of another user whose descriptors
// this one may not read. It finds each client socket's inode in
// /proc/net/tcp and tcp6, then looks for the inode among the open files
// of the processes of hint first, then, if full, of every process. The
// cost grows with the host's sockets and, on a full scan, its processes'
// open files: call it rarely.
func peerPIDs(conns []net.Conn, hint []int, full bool) []int {
	pids := make([]int, len(conns))
	want := map[string]int{} // "socket:[inode]" -> index in conns
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		socketInodes(f, conns, want)
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
		if pid, err := strconv.Atoi(p.Name()); err == nil && left > 0 {
			look(pid)
		}
	}
	return pids
}

// socketInodes adds to want the inode ("socket:[N]") of the client end
// of each of conns found in file, a /proc/net/tcp table: the socket whose
// local address is the connection's remote one and the other way round.
func socketInodes(file string, conns []net.Conn, want map[string]int) {
	f, err := os.Open(file)
	if err != nil {
		return
	}
	defer f.Close()
	type ends struct{ local, remote netip.AddrPort }
	idx := make(map[ends]int, len(conns))
	for i, c := range conns {
		l, lok := c.LocalAddr().(*net.TCPAddr)
		r, rok := c.RemoteAddr().(*net.TCPAddr)
		if lok && rok {
			idx[ends{unmap(r.AddrPort()), unmap(l.AddrPort())}] = i
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fld := strings.Fields(sc.Text())
		if len(fld) < 10 {
			continue
		}
		local, ok1 := procAddr(fld[1])
		remote, ok2 := procAddr(fld[2])
		if i, ok := idx[ends{local, remote}]; ok && ok1 && ok2 {
			want["socket:["+fld[9]+"]"] = i
		}
	}
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }

// procAddr decodes an address of /proc/net/tcp ("0100007F:1F90": the IP
// in 32-bit words of host byte order, the port in hex), IPv4-mapped
// addresses unmapped.
func procAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(h)
	port, perr := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || perr != nil || len(b)%4 != 0 {
		return netip.AddrPort{}, false
	}
	for i := 0; i < len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.NativeEndian.Uint32(b[i:]))
	}
	ip, ok := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), ok
}
