package daemon

import (
	"bytes"
	"errors"
	"net"
	"os"
	"time"
)

// serve answers the queries of c until it closes, idles for
// IdleTimeout, owes replies it does not take for WriteTimeout, or
// Shutdown. Every read is answered at once: replies to every complete
// line read are flushed before the next read, and the read deadline is
// renewed before each read, so that a connection is idle only when no
// byte arrives for IdleTimeout.
func (s *Server) serve(sc *conn) {
	cs := s.newConnState(sc)
	defer cs.close()
	for cs.answerRead() {
		if cs.last {
			if !cs.reset {
				lingerClose(cs.c)
			}
			return
		}
		cs.readMore()
	}
}

// connState is what serve keeps of one connection: the bytes read and
// not answered yet, the replies not written yet, and how it ends.
type connState struct {
	s       *Server
	sc      *conn
	c       net.Conn
	maxLine int
	buf     []byte
	start   int // buf[start:end] is read and not answered yet
	end     int
	out     []byte   // replies not written yet
	lines   [][]byte // the complete lines of one read
	asks    lineAsks
	// drain, during Shutdown: the bytes received before it, still to
	// read; -1 before.
	drain      int
	last       bool      // the last read is done: answer it, then close
	reset      bool      // close with a reset, not a FIN
	quietSince time.Time // when the last byte arrived
}

func (s *Server) newConnState(sc *conn) *connState {
	if tc, ok := sc.c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(replyBudget)
	}
	maxLine := s.cfg.MaxTagLen + 2
	return &connState{s: s, sc: sc, c: sc.c, maxLine: maxLine, buf: make([]byte, max(2*maxLine, 1024)),
		out: make([]byte, 0, 1024), drain: -1, quietSince: time.Now()}
}

// close closes the connection (with a reset if asked) and forgets it.
func (cs *connState) close() {
	if tc, ok := cs.c.(*net.TCPConn); ok && cs.reset {
		tc.SetLinger(0)
	}
	cs.c.Close()
	cs.s.mu.Lock()
	cs.s.unlink(cs.sc)
	cs.s.mu.Unlock()
	cs.s.wg.Done()
}

// stopping reports Shutdown, or that the connection was reclaimed.
func (cs *connState) stopping() bool { return cs.s.stopped.Load() || cs.sc.reclaimed.Load() }

func (cs *connState) writeTimeout() time.Duration {
	if cs.stopping() {
		return min(cs.s.conf.Load().write, shutdownWrite)
	}
	return cs.s.conf.Load().write
}

// answerRead answers every complete line read, as one batch (see
// Server.answerLines), and flushes the replies. It reports false if the
// connection is done: a line too long (answered ER) or replies not taken.
func (cs *connState) answerRead() bool {
	cs.lines = cs.lines[:0]
	long := false
	for {
		i := bytes.IndexByte(cs.buf[cs.start:cs.end], '\n')
		if i < 0 {
			break
		}
		line := cs.buf[cs.start : cs.start+i+1]
		cs.start += i + 1
		if long = len(line) > cs.maxLine; long {
			break
		}
		cs.lines = append(cs.lines, line)
	}
	cs.out = cs.s.answerLines(cs.lines, cs.out, &cs.asks)
	if long || cs.end-cs.start >= cs.maxLine {
		cs.s.oversized(cs.c, cs.out)
		return false
	}
	if !cs.flush() {
		return false
	}
	cs.end = copy(cs.buf, cs.buf[cs.start:cs.end])
	cs.start = 0
	return true
}

// flush writes the replies; a client that takes none of them for
// WriteTimeout is cut off, one that takes some is waited for.
func (cs *connState) flush() bool {
	for len(cs.out) > 0 {
		cs.c.SetWriteDeadline(time.Now().Add(cs.writeTimeout()))
		n, err := cs.c.Write(cs.out)
		cs.out = cs.out[n:]
		if err == nil || n > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			cs.s.st.writeTimeouts.Add(1)
			cs.s.log.Debug("replies not read, resetting", "remote", cs.c.RemoteAddr().String())
		}
		cs.reset = true
		return false
	}
	cs.out = cs.out[:0:cap(cs.out)]
	return true
}

// readMore reads what the client sent next, waiting at most until the
// connection idles, and marks the last read: at Shutdown or reclaim
// (what was received before it), an idle client, or an error.
func (cs *connState) readMore() {
	if cs.drain < 0 && cs.stopping() {
		// Shutdown or reclaimed: answer what the client sent before
		// it, no more.
		cs.drain = 0
		if n, ok := pending(cs.c); ok {
			cs.drain = n
		}
	}
	if cs.drain == 0 {
		cs.last = true
		return
	}
	limit := len(cs.buf)
	if cs.drain > 0 {
		cs.c.SetReadDeadline(time.Now().Add(shutdownWrite))
		limit = min(limit, cs.end+cs.drain)
	} else {
		// Wake at IdleTimeout of silence, and every WriteTimeout
		// before, to see whether the client left replies untaken.
		wake := time.Now().Add(cs.writeTimeout())
		if idle := cs.quietSince.Add(cs.s.conf.Load().idle); idle.Before(wake) {
			wake = idle
		}
		cs.c.SetReadDeadline(wake)
		if cs.stopping() {
			return // Shutdown or reclaim came before the deadline was set
		}
	}
	n, err := cs.c.Read(cs.buf[cs.end:limit])
	cs.end += n
	if cs.drain > 0 {
		cs.drain -= n
	} else if n > 0 {
		cs.quietSince = time.Now()
		cs.sc.last.Store(int64(cs.quietSince.Sub(cs.s.epoch)))
	}
	if err != nil {
		cs.readFailed(err)
	}
}

// readFailed decides what a failed read means: a wake-up to go on
// reading, or the last read (idle, closed by the client, or failed: its
// lines are answered, then the connection closes). An idle connection is
// reset: the replies it still owes will not be read.
func (cs *connState) readFailed(err error) {
	timeout := errors.Is(err, os.ErrDeadlineExceeded)
	if timeout && cs.drain < 0 && cs.stopping() {
		return // woken by Shutdown or reclaim
	}
	if timeout && cs.drain < 0 && time.Since(cs.quietSince) < cs.s.conf.Load().idle {
		if n, ok := unsent(cs.c); !ok || n == 0 {
			return // quiet, not idle yet, and it took its replies
		}
		cs.s.st.replyResets.Add(1)
		cs.s.log.Debug("replies not taken, resetting", "remote", cs.c.RemoteAddr().String())
	}
	cs.reset = cs.reset || timeout && cs.drain < 0
	cs.last = true
}
