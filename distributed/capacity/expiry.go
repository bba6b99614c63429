package capacity

import (
	"time"
)

// The expiry of leases, and forgetting the resources nobody holds.

// skewTolerance is the clock rate difference a lease's count at the
// server allows for: a server's clock may run up to 5 % faster than its
// client's. A lease counts at the server for its length plus that part of
// it (skewGrace) on the server's clock, so that a fast server does not
// hand out again capacity a client still holds on its own clock.
const skewTolerance = 0.05

// skewGrace is how long past its expiry a lease of length lease still
// counts at the server.
func skewGrace(lease time.Duration) int64 {
	return int64(float64(lease) * skewTolerance)
}

// expire drops the clients whose lease has stopped counting (its expiry
// plus its skewGrace), and a lowered lease's old size once the old lease
// has (it may outlive a shorter grant).
func (r *resource) expire(now int64) {
	if r.next == 0 || now < r.next {
		return
	}
	r.next = 0
	for i := 0; i < len(r.list); {
		h := r.list[i]
		if h.until <= now && h.prevUntil <= now && h.oldUntil <= now {
			r.remove(h)
			continue
		}
		if h.prevUntil != 0 {
			if h.prevUntil <= now {
				r.dropPrev(h)
			} else {
				r.wakeAt(h.prevUntil)
			}
		}
		if h.oldUntil != 0 {
			if h.oldUntil <= now {
				r.dropOld(h)
			} else {
				r.wakeAt(h.oldUntil)
			}
		}
		if h.until > now {
			r.wakeAt(h.until)
		}
		i++
	}
}

func (r *resource) remove(h *holder) {
	r.held -= h.counted()
	r.sumU -= h.u
	last := r.list[len(r.list)-1]
	r.list[h.idx] = last
	last.idx = h.idx
	r.list[len(r.list)-1] = nil
	r.list = r.list[:len(r.list)-1]
	delete(r.holders, h.client)
	r.leases.add(h.client, -1)
	r.dirty = true
}

// dropInterval is how often a server looks for resources that no client
// holds or wants any more: it forgets a resource it finds so twice in a
// row, so that its state, and its place under the bound of resources
// (WithMaxResources), is freed one to two DropIntervals after its last
// lease expired or was released, while a client whose refresh arrives
// just after its lease expired finds the resource as it was.
const dropInterval = time.Second

// drop forgets the resources that no client holds or wants any more (all
// their leases have expired or were released), so that their ids, made
// up or not, do not fill the bound of resources. It looks at most once
// per dropInterval. s.mu is held.
func (s *Server) drop(now int64) {
	if now < s.sweepAt {
		return
	}
	s.sweepAt = now + int64(dropInterval)
	for id, r := range s.resources {
		n := len(r.list)
		r.expire(now)
		switch {
		case len(r.list) > 0:
			r.idle = 0
			if len(r.list) < n {
				s.reportUpstream(r) // clients left: a server in a tree wants less
			}
			continue
		case r.idle == 0:
			r.idle = now
			continue
		}
		delete(s.resources, id)
		if r.up != nil {
			s.closeUpstream(r)
		}
	}
}
