// Package gossip is a distributed token bucket for a cluster of hosts
// behind a load balancer: each node decides locally (no network round
// trip on the request path) and is charged, one gossip interval later,
// for what every other node admitted.
//
//	tr, err := gossip.ListenUDP("10.0.0.5:7946")
//	node, err := gossip.NewNode(gossip.Config{Transport: tr, Secret: secret, SpendCap: true,
//		Peers: []string{"10.0.0.6:7946", "10.0.0.7:7946"}})
//	api, err := node.NewLimiter("api", throttle.PerSecond(100), 200)
//	node.Start()
//	defer node.Close()
//	d, err := api.Allow(ctx, clientKey, 1)
//
// Each node keeps, per limit and per key, a token bucket and a count of
// the units it admitted. Every Config.Interval it sends its peers those
// counts as cumulative counters; a peer debits the growth from its own
// buckets, which may go negative, so a client that burst on every node
// pays it back on every node. Datagrams are authenticated with
// HMAC-SHA256 under Config.Secret (or encrypted and authenticated with
// AES-GCM under a rotating keyring: Seal), bound to their receiver and its
// incarnation, and numbered; forged, malformed and replayed ones are
// dropped and counted (Stats). The protocol, its simulations and its
// measurements are described in docs/design/gossip.md in the repository.
//
// # Guarantees
//
// Long run: every admitted unit is charged on every node once the reports
// arrive, so the cluster's long-run rate is the configured rate, whatever
// the number of nodes and after partitions of any length; lost,
// duplicated and reordered datagrams neither lose nor double-count hits.
//
// Burst without the spend cap: until the first report arrives each node
// admits at its own bucket's pace, so the cluster admits up to
// N x (burst + rate x the time to the first report), at most about
// N x (burst + rate x (interval + delivery delay)), then refuses until
// the debt is paid back.
//
// Burst with the cap (Config.SpendCap): while every peer's reports up to
// the round before the last have arrived (those of the last round may be
// delayed by any amount) and clocks are synchronized, the cluster admits
// at most burst + rate x d + N-1 in any window of length d. If a peer is
// unheard for more than a round (reports lost) the bound degrades, at
// worst to the bound without the cap. A peer unheard for Resend+3
// intervals leaves the shares until it speaks again; one the
// Config.Membership declares dead leaves them at once. While demand shifts
// between nodes, or until the peers' reports of a round arrive, a node
// may refuse although tokens are left on others; they are not lost.
//
// Attacks: what a peer reports of a key is capped, per (key, peer), at
// what it could have admitted: burst plus two rounds of refill, refilled
// at the limit's rate in the sender's rounds (which may not run ahead of
// the receiver's) for all the time the peer was unheard, and one more
// burst, at most once per retention, for a new incarnation; so a node holding the secret
// can charge its peers no more than an honest node at full speed, plus
// one burst per retention (the excess is counted in Stats.Capped, saturating). A
// state a joining node catches up from lowers a bucket no further than
// every member's reports could. A node's incarnation is its start time,
// and a peer refuses datagrams from, or addressed to, an older
// incarnation than the one it knows, so a datagram captured in an earlier
// life of either node and replayed later changes nothing.
//
// Residual inaccuracies: a report debited to a bucket that refilled to
// full meanwhile charges up to rate x interval more than one global
// bucket would (never less); a decision in flight while a peer reads a
// bucket for a node that joins or restarts may be charged twice to that
// node (never missed); clocks must agree within about one interval; a
// counter idle for longer than the retention (twice the time to refill
// the bucket, at least 10 rounds) and acknowledged by every live peer is
// forgotten, so a peer that comes back later misses those hits. A node
// that joins or restarts catches up from its peers' bucket levels: they
// send them a budget a round, resuming after what it acknowledged, so
// the catch-up takes rounds in proportion to the keys below full. A node
// that has peers (or a Config.Membership, or peers within 2 intervals of
// its start) keeps each key's admissions in its new life within what a
// bucket empty at its start would have refilled (rate x the time
// since), from its first decision: until it has heard every peer start
// within an interval of it (a first start of the cluster; Start runs a
// round at once, so this costs the wait for the peers' first datagrams),
// or, if some stay silent, for 2 intervals and until it has heard one
// peer at least (with a Membership: until the membership reports every
// silent member dead or gone, as a silent member may only be slow); and,
// once a peer that started more than an interval before it has spoken (a
// restart, or a late join), until one such peer has sent every level.
// Keys its peers exhausted are not admitted again.
//
// # Rounds that cannot carry every change
//
// A round carries at most Config.MaxRoundBytes of counters to a peer;
// when more change, the rest follow in later rounds, cumulative, and
// every reported hit is charged however late (buckets go negative), so
// the long-run rate of a key in steady use stays exact. The lag, L
// rounds, widens the burst bound: a key may be admitted up to
// burst + rate x L x interval on each node before its first charges
// arrive. Stats.Behind counts the rounds that left counters out.
//
// # Owner routing
//
// For limits with many active keys (a million on three nodes), a
// Limiter's all-to-all counters cost every node every key's bucket and a
// report of every key to every peer. Node.NewOwnedLimiter makes an
// OwnedLimiter instead: each key has one owner, the live member that wins
// the rendezvous hash of the key and the member IDs, which decides it on
// its own exact bucket; the other nodes forward their decisions to it in
// batches (one datagram per owner, authenticated like every other) and
// wait for the answer up to a timeout, after which they decide on a local
// fallback bucket of rate and burst divided by the configured members (at
// once while that owner has not answered since). While the members agree
// and answers arrive in time the cluster admits exactly one bucket per
// key; a member that joins or dies moves only its keys, and their new
// owner, like a restarted one, starts them empty. A node that hears no
// majority of the members decides every key on its fallback buckets, and
// what fallback buckets admit is charged to the owners afterwards. See
// OwnedLimiter for the bounds under loss, partitions and restarts, and
// docs/design/gossip.md for which to pick when.
//
// # Memory and the key cap
//
// Each limiter tracks at most the node's throttle.WithMaxKeys keys, about
// 140 bytes a key decided on one node alone, plus a 128-byte record per
// peer that reported it (about 480 bytes of heap a key and node where
// each of three nodes admits every key), and 8 bytes per round that
// changed it among the last Config.Resend+4 rounds run; idle keys are
// dropped by Tick after the retention, once their bucket is full again. Past the cap, new keys share one bucket
// under OverflowKey, limited and gossiped like any key, never unlimited;
// a peer's reports of keys a full table has no room for are charged to
// that bucket too (their growth over the last value seen, remembered in
// a fixed array of 4,096 counters; a counter forgotten is charged again
// in full), no lower than the reports of every member could take a full
// bucket, so every key stays within about one bucket.
// A round sends each peer at most Config.MaxRoundBytes (before
// Config.Copies copies), whatever the number of keys; the rest follows in
// later rounds. Its work follows what it sends, not the keys changed: it
// reads the changed keys in the order the rounds took them, and sorts
// nothing. Version 2 of the wire format does not understand version
// 1: upgrade every node of a cluster together.
package gossip
