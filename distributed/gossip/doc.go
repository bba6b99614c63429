// Package gossip is a distributed token bucket for a cluster of hosts
// behind a load balancer: each node decides locally (no network round
// trip on the request path) and is charged, one gossip interval later,
// for what every other node admitted.
//
// Each node keeps, per limit and per key, a token bucket (the GCRA of
// package tokenbucket) and a count of the units it admitted. Every
// Interval it sends its peers those counts; a peer debits them from its
// own buckets, which may go negative, so a client that burst on every
// node pays it back on every node. This is the scheme of the DThrottle
// daemon, with four changes:
//
//   - Reports carry cumulative counters per (node incarnation, key), not
//     per-interval deltas. A receiver debits the growth over the highest
//     value it has seen, so lost, duplicated and reordered datagrams
//     neither lose nor double-count hits. Each datagram says which of the
//     receiver's rounds the sender got in full; a node resends every
//     counter changed since the latest round a peer acknowledged, so a
//     loss is repaired at the next round, and a peer back from a
//     partition gets everything it missed. Each round's datagrams are
//     sent Config.Copies times (default 2), so that a round is lost only
//     if every copy is.
//   - A node that joins or restarts catches up: its peers send it their
//     bucket levels (less the hits of its own they have not counted yet),
//     and it lowers its fresh buckets to them.
//   - Optional spend cap (Config.SpendCap): within one interval a node
//     admits for a key at most its share of the tokens left, shares being
//     proportional to the demand each node reported for the previous
//     interval (equal when unknown), rounded by largest remainder so that
//     they add up to the tokens left. A node without the cap reports what
//     it admitted as its demand: that, not what it is asked, is what it
//     takes of the tokens. A round counts a node's demand for a key up to
//     16 times what the cluster could admit for it in a round (burst plus
//     a round's refill), and a peer's report weighs no more: demand past
//     that cannot be met anyway, and counting it would let the node
//     flooded most take the tokens of nodes flooded less. It also makes a
//     denial in such a flood a pure read.
//   - Datagrams are authenticated with HMAC-SHA256 under a shared secret;
//     forged, malformed and foreign ones are dropped and counted (Stats).
//     The MAC covers the receiver's ID, and each datagram carries the
//     receiver's incarnation as the sender knows it and a sequence number,
//     so a datagram captured on the wire and replayed later, to its
//     receiver or to another node, is refused (Stats.Duplicate,
//     Stats.Stale, Stats.BadMAC). A datagram must come from the address
//     its sender is listed under (Stats.WrongSource).
//   - What a peer reports is capped at what it could have admitted: per
//     key and peer, a token bucket of burst plus two rounds of refill,
//     refilled at the limit's rate in the sender's rounds (which may not
//     run ahead of the receiver's) for all the time the peer went unheard:
//     a peer back from a partition of any length may report all it
//     admitted meanwhile (burst + rate x the partition), and it is
//     charged. The bucket belongs to the (key, peer), not to a counter: a
//     new counter (a new born) starts from what the old one had left, and
//     a new incarnation adds one burst (the fresh bucket a restarted node
//     starts with) at most once per retention. A node holding the secret
//     can therefore charge its peers no more than an honest node at full
//     speed, plus one burst per retention; the excess is counted in
//     Stats.Capped (saturating) and never debited.
//     A state (the bucket levels a joining node catches up from) lowers a
//     bucket no further than the reports of every member could.
//   - A node's incarnation is its start time (ns), and identity only moves
//     forward: a peer adopts an incarnation only if it is newer than the
//     one it knows, and refuses any datagram from an older one, or
//     addressed to an older (or, for states, any other) incarnation of
//     itself than its current one. A datagram captured in an earlier life
//     of either node and replayed later therefore changes nothing, hellos
//     included. A node restarted after its clock was set back starts below
//     its previous life; the first datagram of a peer that still names
//     that life makes it move past it, once.
//
// # Guarantees
//
// Long run: every admitted unit is charged on every node once the reports
// arrive, so the cluster's long-run rate is the configured rate, whatever
// the number of nodes, and after partitions of any length: in the
// simulation (partition_test.go: a client at 3x its rate, cut for 10 s or
// 30 s, then as long again and 20 s to pay the debt back) the limiters
// admit in total 1.000 and 1.002 of one bucket with 2 nodes, 0.996 with 8. In the simulation (sim_test.go: 8 nodes, a random
// load balancer, a client at 3x its rate for 120 s, 2% duplication) the
// admitted/ideal ratio stays within 1% at 0%, 5% and 20% loss, with and
// without the spend cap, with 1, 2 or 3 copies (0.993 to 1.004).
//
// Burst without the cap: until the first report arrives each node admits
// at its own bucket's pace, so the cluster admits up to N x (burst + rate
// x the time to the first report), at most about N x (burst + rate x
// (interval + delivery delay)) (measured: 8 nodes flooded at one instant
// admit exactly 8 x burst; 4 nodes flooded for the 1.009 s until the first
// report admit 600 = 4 x (100 + 50 x 1.009)), then refuses until the debt
// is paid back.
//
// Burst with the cap: if every node has the same view (reports of the last
// round delivered, synchronized clocks), the quotas of one interval add up
// to floor(T), T being the tokens left at the start of the interval plus
// those refilled so far, so the cluster admits at most burst + rate*d in
// any window of length d, like a single bucket, plus one token per node
// and interval for rounding: burst + rate*d + N-1. This holds while the
// reports of the last round are in flight too (any delivery delay): a
// peer whose round has not arrived yet, but whose previous one did, is
// pending, and a node sets aside what a pending peer may have spent in
// the last round (its share of that round, as this node computed it, of
// what the round could spend, plus one token), and gives it that share
// again, until the peer's report of the key, or its whole round, arrives.
// If the nodes disagree on the last round (reports lost, so that a peer
// is unheard for more than a round), shares may add up to more than one
// and the bound degrades, at worst to the bound without the cap; such a
// peer is assumed to have kept spending at its recent hit rate, which
// removes most of that error once a key has a history. Measured (capdelay_test.go: a fresh key
// flooded on every node, 50/s, burst 100, 1 s interval): peak burst 100
// with 4 and 8 nodes and reports delayed 10 ms, and with 4 nodes and 100
// ms (before pending peers were set aside: 123, 144 and 478). A flood on 1
// to 16 fresh nodes admits exactly burst; under sustained random traffic
// (8 nodes, client at 3x) the peak burst is 0.70x to 0.73x of the
// configured burst at 0/5/20% loss with a 1 s interval and at most 0.98x
// with 100 ms, and at most 0.73x over eight seeds at 20% loss with the
// default two copies. The price of the cap: while demand shifts between
// nodes, a node may refuse although tokens are left on others, and at the
// start of a round, until the peers' reports arrive (about the delivery
// delay), it may refuse what they turn out not to have spent (those
// denials are decided under the key's lock, not lock-free). Tokens are not
// lost: the long-run rate holds.
//
// Convergence: hits made on both sides of a partition are charged on
// every node one interval after it heals with no loss. Under loss (8
// nodes, 20 runs each), in intervals on average (at worst):
//
//	copies   5% loss     20% loss
//	1        1.95 (3)    3.40 (6)
//	2        1.15 (2)    2.00 (4)    the default
//	3        1.05 (2)    1.15 (2)
//
// Residual inaccuracies: a report debited to a bucket that refilled to
// full meanwhile charges up to rate x interval more than one global bucket
// would (never less); a decision in flight while a peer reads a bucket
// level for a state sync may be charged twice to a node that joins or
// restarts (never missed: the state carries the sender's counter as read
// before the level, and the receiver takes those hits as delivered, so the
// counter's later reports charge only what came after); clocks must agree within
// about one interval (rounds are aligned on multiples of the interval); a
// counter idle for longer than the retention (twice the time to refill
// the bucket, at least 10 rounds) and acknowledged by every live peer is
// forgotten, so a peer that comes back later misses those hits.
//
// # Large rounds
//
// A round's work follows the keys that changed, not the keys held: a
// decision that changes a key's counters for the first time in a round
// records the entry in a lock-free list (one atomic add, amortized no
// allocation), and the round takes that list and keeps those of the last
// Resend+4 rounds; the reports for a peer are built from the rounds since
// the one it acknowledged, and only a peer further behind (back from a
// partition, or a backlog) makes the round scan the whole table.
// Expiry sweeps an eighth of the table a round. Measured
// (BenchmarkRoundIdleKeys: 1,000 keys changed per round, one peer
// acknowledging every round): a round took 52-82 ms with 100,000 keys
// held and 0.76-1.02 s with 1,000,000 when it scanned and sorted them
// all; 2-12 ms and 49-132 ms now, most of it the expiry sweep. Each key
// changed in one of the rounds kept costs 8 bytes more per such round.
//
// A round sends each peer the counters it has not acknowledged, in a
// fixed order (the round they changed in, limiter, key), at most
// Config.MaxRoundBytes of them (2 MB, about 100,000 short keys); the rest
// follow in later rounds, those pending longest first. A peer
// acknowledges the latest round it got in full and, for a round it got in
// part, how many leading datagrams it got without a gap: the counters
// they carried are not sent again. When a round has a backlog or is cut,
// up to a quarter of it first carries the counters changed in the last
// round, busiest first, so that a flood of new keys delays only itself:
// in the simulation a node flooded with 3,000 new keys a round, beyond
// what its peer's receive queue takes, still has a steady key charged on
// the peer every round, and the backlog drains once the flood stops. The
// bound per peer adapts like TCP's
// congestion window (halved while rounds go unacknowledged, raised by 8
// datagrams a round while they are), so a round larger than a peer's
// receive buffer shrinks until it fits instead of being lost again every
// round; ListenUDP asks for an 8 MB receive buffer (RecvBuffer; Linux
// caps it at net.core.rmem_max). Measured (large_test.go): 100,000 keys
// each hit once on one node are all charged by its peer over loopback UDP
// within 3 rounds (63% after the first, the round being cut at 2 MB); in
// the simulation, through receive queues of 150 datagrams (Linux's
// default 212,992-byte buffer) with 2% loss, every hit is charged on both
// peers after 50 rounds, none lost or counted twice. Per-round traffic is
// bounded by MaxRoundBytes x Copies per peer, whatever the number of keys.
//
// # Memory and the key cap
//
// Each limiter tracks at most the node's throttle.WithMaxKeys keys. A key
// decided on one node alone costs about 140 bytes (its 128-byte entry,
// which holds the key, its bucket and its counters, and its slot in the
// table; TestMemoryPerKey), plus one record per peer that reported the
// key. Idle keys are forgotten after the retention above, once their
// bucket is full again: peers' debits can leave a bucket in debt for
// longer, and a key forgotten in debt would be admitted again too soon.
// Expiry sweeps an eighth of the table a round, so a key goes up to 8
// rounds after it could, and a peer's record of a key is kept 8 rounds
// longer than the retention (so that it outlives the peer's counter).
// When the table is full, a new key is decided and gossiped under
// OverflowKey: all such keys share one bucket of the limit, charged on
// every node, so they stay limited (together, hence more strictly) and
// shared, never unlimited; Stats.Overflow counts those decisions. A peer
// whose own table is full does not track reports of keys new to it (also
// counted in Stats.Overflow); the sender's own limit still applies to
// them. Size WithMaxKeys (the daemon's max_keys) above the keys active
// within the retention.
//
// # Redundancy and its cost
//
// Config.Copies multiplies the gossip traffic: every datagram of a round
// goes out that many times to each peer (duplicates are harmless, the
// counters being cumulative). In the simulation above (one hot key, 7
// peers) a node sends about 650 bytes per interval with one copy, 1,300
// with two, 1,960 with three: a round costs each node Copies x peers x its
// datagrams (about 90 bytes for one short key, many keys in each up to
// MaxPacket). Copies are sent right after the round rather than spread
// over the interval, so loss that comes in bursts longer than a round's
// datagrams can take them all; a later round repairs it, as with one copy.
// On a network that rarely drops packets, Copies = 1 halves the traffic;
// where loss is heavy, 3 brings convergence within 2 intervals in every
// run of the simulation at 20% loss.
//
// # Transports and membership
//
// Transport is an interface. ListenUDP sends each datagram (at most
// MaxPacket = 1400 bytes, many keys per datagram, as many datagrams as the
// keys need) as one UDP packet to each peer, Config.Copies times: traffic
// grows with the keys seen per interval and the peers, not with the
// requests. Network is an
// in-memory network on virtual time with loss, duplication, delay, jitter
// and partitions, for tests and simulations; there Tick and
// Network.Deliver are driven by the caller instead of timers.
//
// Members are a static list (Config.Peers) changed at run time with
// Node.Join and Node.Leave. To discover members with
// github.com/hashicorp/memberlist instead, run memberlist beside the node
// and forward its events; carry the gossip address in the node metadata:
//
//	type events struct{ node *gossip.Node }
//
//	func (e events) NotifyJoin(m *memberlist.Node)   { e.node.Join(string(m.Meta)) }
//	func (e events) NotifyLeave(m *memberlist.Node)  { e.node.Leave(string(m.Meta)) }
//	func (e events) NotifyUpdate(m *memberlist.Node) {}
//
//	cfg := memberlist.DefaultLANConfig()
//	cfg.Events = events{node}
//	cfg.Delegate = meta(node.ID()) // NodeMeta returns []byte(node.ID())
//	list, _ := memberlist.Create(cfg)
//	list.Join(seeds)
//
// The node's own failure detection takes a peer unheard for Resend+3
// intervals out of the spend-cap shares (its share of a key's tokens goes
// to the live members) and sends it hellos only, until it speaks again;
// memberlist's Leave events remove it for good. The gossip secret stays
// separate from memberlist's keyring.
//
// # Wire format
//
// See wire.go: a versioned binary header (magic "TG", version 2, type,
// acknowledgement, part, sequence number, receiver incarnation, sender,
// limiter name, incarnation, round, start time, entry count),
// varint-encoded entries, and a 32-byte HMAC-SHA256 trailer over the
// receiver's ID and everything before it. Version 2 nodes do not
// understand version 1 (upgrade every node of a cluster together).
package gossip
