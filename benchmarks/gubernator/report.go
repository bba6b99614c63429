package main

import (
	"fmt"
	"io"
	"strconv"
	"time"
)

// sample is one measurement of a cell.
type sample struct {
	rate, p50, p99 float64 // decisions/s; latency in µs
	server, client float64 // CPU µs per decision
}

type cell struct{ conns, batch int }

var subjects = []string{"throttled", "gubernator"}

// speed measures both subjects, one node each, at every connection count
// (and batched), alternating within each round, and reports medians and
// ranges.
func speed(o *options, throttledBin string, out io.Writer) error {
	addrs, err := freeAddrs(2)
	if err != nil {
		return err
	}
	// Every key gets far fewer decisions than its limit: all admitted.
	t, err := startThrottled(o, throttledBin, 0, addrs[0], 1_000_000, "", nil)
	if err != nil {
		return err
	}
	defer t.stop()
	g, err := startGubernator(o, 0, addrs[1], nil)
	if err != nil {
		return err
	}
	defer g.stop()
	servers := map[string]*proc{"throttled": t, "gubernator": g}
	var cells []cell
	for _, c := range o.conns {
		cells = append(cells, cell{c, 1})
	}
	if o.batch > 1 {
		for _, c := range o.conns {
			cells = append(cells, cell{c, o.batch})
		}
	}
	// Warm-up, not recorded.
	for _, s := range subjects {
		if _, err := measureSpeed(o, servers[s], s, cell{16, 1}, time.Second); err != nil {
			return err
		}
	}
	got := map[string]map[cell][]sample{"throttled": {}, "gubernator": {}}
	for r := range o.rounds {
		for _, c := range cells {
			for _, s := range roundOrder(r) {
				x, err := measureSpeed(o, servers[s], s, c, o.duration)
				if err != nil {
					return err
				}
				got[s][c] = append(got[s][c], x)
			}
		}
	}
	writeSpeed(out, o, cells, got)
	return nil
}

// roundOrder is the order in which round r measures the subjects: each
// goes first every other round.
func roundOrder(r int) []string {
	if r%2 == 1 {
		return []string{subjects[1], subjects[0]}
	}
	return subjects
}

// measureSpeed offers load to subject's server for d over c's
// connections and batches, and measures it; every decision must admit.
func measureSpeed(o *options, server *proc, subject string, c cell, d time.Duration) (sample, error) {
	res, cpu, err := runLoad(o, 1, []*proc{server}, "-proto", subject, "-addrs", server.addr,
		"-conns", strconv.Itoa(c.conns), "-batch", strconv.Itoa(c.batch), "-duration", d.String())
	if err != nil {
		return sample{}, err
	}
	if res.Allowed != res.Decisions {
		return sample{}, fmt.Errorf("%s: %d of %d admitted, want all", subject, res.Allowed, res.Decisions)
	}
	n := float64(res.Decisions)
	return sample{rate: n / res.Seconds, p50: res.P50, p99: res.P99, server: cpu / n * 1e6, client: res.CPU / n * 1e6}, nil
}

// writeSpeed writes the speed section: every cell's medians and ranges,
// then throttled's over gubernator's, paired by round.
func writeSpeed(out io.Writer, o *options, cells []cell, got map[string]map[cell][]sample) {
	pin := "unpinned"
	if o.pin {
		pin = "each server on CPU 0 (taskset), the load generator on CPU 1"
	}
	fmt.Fprintf(out, "\n## Speed: one node each, %d rounds of %v per cell, %s\n\n", o.rounds, o.duration, pin)
	fmt.Fprintln(out, "Median of the rounds, and the range. A round trip is one decision (batch 1), or a batch: that many lines pipelined in one write (throttled), that many requests in one GetRateLimits call (gubernator).")
	fmt.Fprintln(out, "\n| conns | batch | subject | decisions/s | p50 µs | p99 µs | server CPU µs/decision | load generator CPU µs/decision |")
	fmt.Fprintln(out, "|---:|---:|---|---:|---:|---:|---:|---:|")
	for _, c := range cells {
		for _, s := range subjects {
			xs := got[s][c]
			col := func(f func(sample) float64, prec int) string {
				v := make([]float64, len(xs))
				for i, x := range xs {
					v[i] = f(x)
				}
				m, lo, hi := median(v)
				return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, m, prec, lo, prec, hi)
			}
			fmt.Fprintf(out, "| %d | %d | %s | %s | %s | %s | %s | %s |\n", c.conns, c.batch, s,
				col(func(x sample) float64 { return x.rate }, 0), col(func(x sample) float64 { return x.p50 }, 0),
				col(func(x sample) float64 { return x.p99 }, 0), col(func(x sample) float64 { return x.server }, 2),
				col(func(x sample) float64 { return x.client }, 2))
		}
	}
	fmt.Fprintln(out, "\nthrottled / gubernator, paired by round (median and range):")
	fmt.Fprintln(out, "\n| conns | batch | decisions/s | p99 | server CPU per decision |")
	fmt.Fprintln(out, "|---:|---:|---:|---:|---:|")
	for _, c := range cells {
		ratio := func(f func(sample) float64) string {
			v := make([]float64, o.rounds)
			for i := range v {
				v[i] = f(got["throttled"][c][i]) / f(got["gubernator"][c][i])
			}
			m, lo, hi := median(v)
			return fmt.Sprintf("%.2f× (%.2f–%.2f)", m, lo, hi)
		}
		fmt.Fprintf(out, "| %d | %d | %s | %s | %s |\n", c.conns, c.batch, ratio(func(x sample) float64 { return x.rate }),
			ratio(func(x sample) float64 { return x.p99 }), ratio(func(x sample) float64 { return x.server }))
	}
}

// accuracy runs 3 nodes of each subject sharing one global limit, and
// offers them load spread over the nodes: admitted / allowed, where
// allowed is what one exact bucket would admit (burst + rate × time).
func accuracy(o *options, throttledBin string, out io.Writer) error {
	nodes, err := startAccuracyNodes(o, throttledBin)
	defer func() {
		for _, s := range subjects {
			for _, p := range nodes[s] {
				p.stop()
			}
		}
	}()
	if err != nil {
		return err
	}
	got := map[string][]accSample{}
	for r := range o.rounds {
		for _, s := range roundOrder(r) {
			common := []string{"-proto", s, "-conns", strconv.Itoa(o.accConns), "-duration", o.accuracy.String(),
				"-rate", strconv.FormatFloat(o.offered, 'f', -1, 64), "-key", fmt.Sprintf("accuracy-%d", r), "-addrs", joinAddrs(nodes[s])}
			if s == "gubernator" {
				common = append(common, "-global", "-limit", strconv.Itoa(o.rate), "-burst", strconv.Itoa(o.rate), "-period", "1s")
			}
			res, _, err := runLoad(o, -1, nodes[s], common...)
			if err != nil {
				return err
			}
			got[s] = append(got[s], accSample{float64(res.Allowed), float64(o.rate) + float64(o.rate)*res.Seconds})
		}
	}
	writeAccuracy(out, o, got)
	return nil
}

// accSample is one round of the accuracy run of a subject.
type accSample struct{ admitted, allowed float64 }

// startAccuracyNodes starts 3 nodes of each subject, each subject's
// sharing one limit. On an error it returns the nodes started so far.
func startAccuracyNodes(o *options, throttledBin string) (map[string][]*proc, error) {
	nodes := map[string][]*proc{}
	a, err := freeAddrs(9)
	if err != nil {
		return nodes, err
	}
	tcp, udp, grpcs := a[0:3], a[3:6], a[6:9]
	for i := range 3 {
		var peers []string
		for j := range 3 {
			if j != i {
				peers = append(peers, udp[j])
			}
		}
		p, err := startThrottled(o, throttledBin, -1, tcp[i], o.rate, udp[i], peers)
		if err != nil {
			return nodes, err
		}
		nodes["throttled"] = append(nodes["throttled"], p)
	}
	for i := range 3 {
		p, err := startGubernator(o, -1, grpcs[i], grpcs)
		if err != nil {
			return nodes, err
		}
		nodes["gubernator"] = append(nodes["gubernator"], p)
	}
	return nodes, nil
}

// writeAccuracy writes the accuracy section.
func writeAccuracy(out io.Writer, o *options, got map[string][]accSample) {
	interval := "1s (its default)"
	if o.interval > 0 {
		interval = o.interval.String()
	}
	fmt.Fprintf(out, "\n## Accuracy: one global limit of %d/s (burst %d) across 3 nodes, %d rounds of %v\n\n", o.rate, o.rate, o.rounds, o.accuracy)
	fmt.Fprintf(out, "%.0f decisions/s offered in all over %d connections spread evenly over the nodes; one fresh key per round. throttled: gossip every %s; gubernator: GLOBAL behavior, LEAKY_BUCKET, its defaults (GlobalSyncWait %v). Allowed = burst + rate × time.\n\n",
		o.offered, o.accConns, interval, o.gubSync)
	fmt.Fprintln(out, "| subject | admitted / allowed, median (range) | admitted, median | allowed, median |")
	fmt.Fprintln(out, "|---|---:|---:|---:|")
	for _, s := range subjects {
		var ratio, adm, all []float64
		for _, x := range got[s] {
			ratio = append(ratio, x.admitted/x.allowed)
			adm = append(adm, x.admitted)
			all = append(all, x.allowed)
		}
		m, lo, hi := median(ratio)
		ma, _, _ := median(adm)
		ml, _, _ := median(all)
		fmt.Fprintf(out, "| %s | %.3f (%.3f–%.3f) | %.0f | %.0f |\n", s, m, lo, hi, ma, ml)
	}
}

func joinAddrs(ps []*proc) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += ","
		}
		s += p.addr
	}
	return s
}
