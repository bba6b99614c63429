package daemon

import (
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// conn is a client connection as the caps see it. It sits in two lists
// ordered by when its last byte arrived, oldest first: every connection's
// (Server.all) and its client's (Server.peers). The lists are kept in
// order lazily: serve records each read's time in last, one atomic store,
// and the lists are put right only when a cap needs the longest-idle
// connection (see connList.oldestIdle).
type conn struct {
	c    net.Conn
	peer string // the client, for MaxConnsPerAddr; "" when unknown
	// last is when the last byte arrived, in nanoseconds since the
	// server's epoch; written by serve.
	last atomic.Int64
	// reclaimed is set when the connection was closed to make room for
	// a new one: serve answers what it has received and closes.
	reclaimed atomic.Bool
	// Under Server.mu: its places in the two lists, whether it left
	// them, and the process of a loopback peer (0: not known yet; see
	// Server.shareLoopback).
	links [2]link
	gone  bool
	pid   int
}

// link is a conn's place in one connList. seen is the conn's last as
// known to that list: at most last, and the list is in ascending order of
// seen.
type link struct {
	prev, next *conn
	seen       int64
}

// connList is an intrusive list of connections in ascending order of
// link.seen; k selects which of a conn's links it uses. Not safe for
// concurrent use (Server.mu guards it). The zero value with k set is an
// empty list.
type connList struct {
	head, tail *conn
	n          int
	k          int
}

// insert puts c in its place by c.links[l.k].seen, searching from the
// tail: a connection is inserted with the latest time, or moved after a
// recent read, so the search is short.
func (l *connList) insert(c *conn) {
	lk := &c.links[l.k]
	p := l.tail
	for p != nil && p.links[l.k].seen > lk.seen {
		p = p.links[l.k].prev
	}
	lk.prev = p
	if p == nil {
		lk.next = l.head
		l.head = c
	} else {
		lk.next = p.links[l.k].next
		p.links[l.k].next = c
	}
	if lk.next == nil {
		l.tail = c
	} else {
		lk.next.links[l.k].prev = c
	}
	l.n++
}

func (l *connList) remove(c *conn) {
	lk := &c.links[l.k]
	if lk.prev == nil {
		l.head = lk.next
	} else {
		lk.prev.links[l.k].next = lk.next
	}
	if lk.next == nil {
		l.tail = lk.prev
	} else {
		lk.next.links[l.k].prev = lk.prev
	}
	lk.prev, lk.next = nil, nil
	l.n--
}

// oldestIdle returns the connection of l whose last byte arrived longest
// ago, if that was at cutoff or before; nil if none is idle so long.
// Connections found active since their place was set are moved to their
// place first; each of them is then not looked at again until it has
// been idle past cutoff, so the cost over time is O(1) per accept plus
// one move per connection per idle budget, never a scan per accept.
func (l *connList) oldestIdle(cutoff int64) *conn {
	for h := l.head; h != nil && h.links[l.k].seen <= cutoff; h = l.head {
		last := h.last.Load()
		if last == h.links[l.k].seen {
			// Every other connection's seen, hence last, is later.
			return h
		}
		l.remove(h)
		h.links[l.k].seen = last
		l.insert(h)
	}
	return nil
}

// now returns the time in nanoseconds since the server's epoch
// (monotonic), as conn.last holds it.
func (s *Server) now() int64 { return int64(time.Since(s.epoch)) }

// admit registers c, a new connection from peer, under the caps of cl,
// making room by closing an idle connection if need be. It reports false
// when c must be refused. Called under s.mu. The returned victim, if
// any, is to be reclaimed (see reclaim) once s.mu is released.
func (s *Server) admit(c *conn, cl *connLimits) (victim *conn, ok bool) {
	pl := s.peers[c.peer]
	overPeer := c.peer != "" && pl != nil && pl.n >= cl.perAddr
	overAll := s.all.n >= cl.maxConns
	if overPeer || overAll {
		if pl != nil && pl.n > cl.perAddr || s.all.n > cl.maxConns {
			// Above a cap a reload lowered: more than one would have to go.
			return nil, false
		}
		cutoff := c.last.Load() - int64(cl.budget)
		if overPeer {
			// One of the client's own: it frees a place under both caps.
			victim = pl.oldestIdle(cutoff)
		} else {
			victim = s.all.oldestIdle(cutoff)
		}
		if victim == nil {
			return nil, false
		}
		s.unlink(victim)
		pl = s.peers[c.peer]
	}
	s.link(c, pl)
	return victim, true
}

// link puts c in the lists: every connection's, and pl, its client's
// (created if nil). Called under s.mu.
func (s *Server) link(c *conn, pl *connList) {
	now := c.last.Load()
	c.links[0].seen, c.links[1].seen = now, now
	s.all.insert(c)
	if c.peer != "" {
		if pl == nil {
			pl = &connList{k: 1}
			s.peers[c.peer] = pl
		}
		pl.insert(c)
	}
}

// shareEvery bounds how often shareLoopback looks up processes: each
// look-up may read every process's open files. shareLookup bounds one
// look-up, so that a refused client (the Go client waits 200 ms by
// default) gets its "RF" in time; a process not found by then is
// refused.
const (
	shareEvery  = 50 * time.Millisecond
	shareLookup = 80 * time.Millisecond
)

// mayShare reports whether c, a connection refused at its address's cap
// (MaxConnsPerAddr) with no idle connection to close, may have a second
// chance (see shareLoopback): its address is a loopback one, and no
// other connection had one within shareEvery. Lock-free.
func (s *Server) mayShare(c *conn) bool {
	tc, isTCP := c.c.RemoteAddr().(*net.TCPAddr)
	if !isTCP || !tc.IP.IsLoopback() || c.peer == "" {
		return false
	}
	last, now := s.shareAt.Load(), s.now()
	return (last == 0 || now-last >= int64(shareEvery)) && s.shareAt.CompareAndSwap(last, now)
}

// shareLoopback is admit's second chance for c, a connection that
// mayShare: its address is a loopback one, whose connections come from
// local processes that share it, and the cap is shared among them. It
// finds the process of c and of that address's connections (see
// peerPIDs); if another process holds at least two more connections than
// c's, c takes the place of that process's longest-idle connection, busy
// or not, which is closed as reclaim does. It reports false, c refused,
// otherwise, or when c's process is unknown (not Linux, another user's
// process). Called without s.mu.
func (s *Server) shareLoopback(c *conn, cl *connLimits) (victim *conn, ok bool) {
	conns, hint := []net.Conn{c.c}, []int{}
	var unknown []*conn
	s.mu.Lock()
	if pl := s.peers[c.peer]; pl != nil {
		for x := pl.head; x != nil; x = x.links[1].next {
			if x.pid == 0 {
				unknown, conns = append(unknown, x), append(conns, x.c)
			} else if !slices.Contains(hint, x.pid) {
				hint = append(hint, x.pid)
			}
		}
	}
	s.mu.Unlock()
	pids := peerPIDs(conns, hint, true, time.Now().Add(shareLookup))
	s.mu.Lock()
	defer s.mu.Unlock()
	c.pid = pids[0]
	for i, x := range unknown {
		x.pid = pids[i+1]
	}
	pl := s.peers[c.peer]
	if s.closing || c.pid == 0 || pl == nil || pl.n != cl.perAddr || s.all.n > cl.maxConns {
		return nil, false
	}
	if victim = pl.biggestHolder(c.pid); victim == nil {
		return nil, false
	}
	s.unlink(victim)
	s.link(c, s.peers[c.peer])
	return victim, true
}

// biggestHolder returns the longest-idle connection of the process that
// holds the most connections of l, if it holds at least two more than
// process pid; nil otherwise. Connections of unknown processes count for
// none. Called under Server.mu.
func (l *connList) biggestHolder(pid int) *conn {
	held := map[int]int{}
	for x := l.head; x != nil; x = x.links[l.k].next {
		if x.pid != 0 {
			held[x.pid]++
		}
	}
	top := 0
	for p, n := range held {
		if n > held[top] || n == held[top] && p < top {
			top = p
		}
	}
	if top == 0 || held[top] < held[pid]+2 {
		return nil
	}
	var oldest *conn
	for x := l.head; x != nil; x = x.links[l.k].next {
		if x.pid == top && (oldest == nil || x.last.Load() < oldest.last.Load()) {
			oldest = x
		}
	}
	return oldest
}

// unlink takes c out of the lists, once. Called under s.mu.
func (s *Server) unlink(c *conn) {
	if c.gone {
		return
	}
	c.gone = true
	s.all.remove(c)
	if pl := s.peers[c.peer]; c.peer != "" && pl != nil {
		if pl.remove(c); pl.n == 0 {
			delete(s.peers, c.peer)
		}
	}
}

// reclaim closes c, an idle connection unlinked to make room for a new
// one: its reader wakes, answers any query received meanwhile, and
// closes it. The client sees the end of the connection as after an
// idle timeout (the Go client retries such a pooled connection on a
// fresh one).
func (s *Server) reclaim(c *conn) {
	s.st.reclaimed.Add(1)
	c.reclaimed.Store(true)
	c.c.SetReadDeadline(time.Now())
}
