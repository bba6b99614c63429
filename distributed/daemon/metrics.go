package daemon

import (
	"bufio"
	"io"
	"net/http"
	"strconv"
)

// adminHandler serves /healthz and /metrics.
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.stopped.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "stopping\n")
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.writeMetrics(w)
	})
	return mux
}

// writeMetrics writes the server's counters to w in the Prometheus text
// exposition format (version 0.0.4), as the admin listener's /metrics
// serves them.
func (s *Server) writeMetrics(w io.Writer) error {
	st := s.Stats()
	g := st.Gossip
	b := bufio.NewWriter(w)
	metric := func(name, typ, help string, samples ...sample) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
		for _, x := range samples {
			b.WriteString(name)
			if x.label != "" {
				b.WriteString("{" + x.label + "}")
			}
			b.WriteByte(' ')
			b.WriteString(strconv.FormatUint(x.v, 10))
			b.WriteByte('\n')
		}
	}
	one := func(v uint64) sample { return sample{v: v} }
	metric("throttled_connections", "gauge", "Client connections open now.", one(uint64(st.Conns)))
	metric("throttled_connections_accepted_total", "counter", "Client connections accepted.", one(st.Accepted))
	metric("throttled_connections_rejected_total", "counter", "Connections closed at once: max_conns or max_conns_per_addr reached.", one(st.Rejected))
	metric("throttled_connections_reclaimed_total", "counter", "Idle connections closed to make room for a new one at max_conns or max_conns_per_addr.", one(st.Reclaimed))
	metric("throttled_write_timeouts_total", "counter", "Connections reset because their replies were not read.", one(st.WriteTimeouts))
	metric("throttled_reply_resets_total", "counter", "Idle connections reset because their replies waited write_timeout untaken.", one(st.ReplyResets))
	metric("throttled_decisions_total", "counter", "Queries answered, by decision.",
		sample{`decision="allowed"`, st.Allowed}, sample{`decision="denied"`, st.Throttled})
	metric("throttled_bad_queries_total", "counter", "Lines answered ER.", one(st.BadQueries))
	metric("throttled_pings_total", "counter", "PING lines answered.", one(st.Pings))
	metric("throttled_reloads_total", "counter", "Configuration reloads, by result.",
		sample{`result="applied"`, st.Reloads}, sample{`result="refused"`, st.ReloadErrors})
	metric("throttled_gossip_rounds_total", "counter", "Gossip rounds run.", one(g.Rounds))
	metric("throttled_gossip_packets_sent_total", "counter", "Gossip datagrams sent.", one(g.PacketsSent))
	metric("throttled_gossip_bytes_sent_total", "counter", "Bytes in gossip datagrams sent.", one(g.BytesSent))
	metric("throttled_gossip_send_errors_total", "counter", "Gossip datagrams the transport refused.", one(g.SendErrors))
	metric("throttled_gossip_packets_received_total", "counter", "Gossip datagrams received and accepted.", one(g.PacketsReceived))
	metric("throttled_gossip_dropped_total", "counter", "Gossip datagrams dropped, by cause.",
		sample{`cause="malformed"`, g.Malformed}, sample{`cause="bad_mac"`, g.BadMAC},
		sample{`cause="unknown_sender"`, g.UnknownSender}, sample{`cause="stale"`, g.Stale},
		sample{`cause="duplicate"`, g.Duplicate}, sample{`cause="wrong_source"`, g.WrongSource},
		sample{`cause="unknown_table"`, g.UnknownTable}, sample{`cause="unsealed"`, st.Unsealed})
	metric("throttled_gossip_hits_applied_total", "counter", "Units debited because peers reported them.", one(g.HitsApplied))
	metric("throttled_gossip_hits_capped_total", "counter", "Reported units not debited: more than the peer could have admitted.", one(g.Capped))
	metric("throttled_gossip_overflow_total", "counter", "Keys not tracked on their own because max_keys was reached.", one(g.Overflow))
	metric("throttled_gossip_resent_total", "counter", "Counters resent because a peer had not acknowledged them.", one(g.Resent))
	metric("throttled_gossip_rounds_behind_total", "counter", "Gossip rounds that could not carry every changed counter: charges lag.", one(g.Behind))
	o := st.Owned
	metric("throttled_gossip_owned_total", "counter", "Decisions of owner-routed limits (gossip.routing \"owner\"), by event.",
		sample{`event="local"`, o.Local}, sample{`event="served"`, o.Served}, sample{`event="forwarded"`, o.Forwarded},
		sample{`event="answered"`, o.Answered}, sample{`event="fallback"`, o.Fallback}, sample{`event="late"`, o.Late},
		sample{`event="batches"`, o.Batches})
	metric("throttled_gossip_owned_units_total", "counter", "Units of owner-routed limits admitted on fallback buckets during a partition: charged to this node's buckets by their owner (charged) or never charged (unowed: too many keys owed).",
		sample{`kind="charged"`, o.Charged}, sample{`kind="unowed"`, o.Unowed})
	return b.Flush()
}

type sample struct {
	label string
	v     uint64
}
