// Package pglimit is a storelimit.Store in a PostgreSQL table: the
// database-backed limit for services that have PostgreSQL and no Redis.
// The decisions are the algorithms' own Go steps (storelimit.Algorithm, run
// by package storelimit); the database only keeps one int64 per key and
// swaps it atomically, so every algorithm of the module works unchanged
// and decides exactly as its in-process limiter on the same trace.
//
//	pool, _ := pgxpool.New(ctx, "postgres://...")
//	store, _ := pglimit.New(pool)
//	_ = store.CreateTable(ctx)
//	alg, _ := tokenbucket.NewAlgorithm(throttle.PerSecond(10), 20)
//	limiter, _ := storelimit.New(store, alg)
//
// # The table
//
//	key     bytea PRIMARY KEY    -- any bytes: a key is never refused by the database
//	state   bigint NOT NULL      -- the Algorithm's state, offset by its fresh state
//	expires timestamptz NOT NULL -- from then on the state decides as a fresh one
//
// A key of up to 1 KiB is stored as it is. A longer one (a
// limiter whose WithMaxKeyLen allows it) is stored as its SHA-256 digest,
// in a form of 1 KiB + 1 bytes that no shorter key has: a B-tree
// entry of PostgreSQL holds about 2.7 KB at most, so a longer key could
// not be stored as it is, and distinct keys stay distinct but for a
// SHA-256 collision.
//
// One table may serve several limiters if their keys differ (prefix
// them); two limiters of different algorithms on one key read each
// other's state as corrupt (an error wrapping throttle.ErrInvalid).
//
// # Round trips and contention
//
// The Store is a storelimit.LoadingStore, so storelimit decides on the state
// it last saw of a key and writes with one statement that swaps only if
// the row is still that state, and otherwise returns the row's state: an
// admission whose guess holds (a key this process wrote last) is one
// round trip, one whose guess is stale two. The swap is an UPDATE ...
// WHERE state = old, or, for a key without a live row, an INSERT ... ON
// CONFLICT DO UPDATE ... WHERE the row expired, with the row's state
// read in the same statement when it affects none. A denial is one
// SELECT (by primary key) and writes nothing.
//
// Under PostgreSQL's default READ COMMITTED isolation a concurrent writer
// of the same row is waited for and the condition re-checked on its
// result, so a write that raced another affects no row and storelimit
// decides again on the state returned: no explicit transaction, no lock
// held across a round trip. (The state returned is read in the
// statement's snapshot, so it may miss the write that was just waited
// for: that costs one more try.) Under a stricter default isolation
// (REPEATABLE READ, SERIALIZABLE) the raced write fails with a
// serialization failure instead; the Store takes that, and a deadlock,
// for a lost race too, and reads the state with a SELECT. Different keys
// never wait for each other.
//
// Many keys: the Store is also a storelimit.BatchStore, so the swaps of a
// process's decisions on different keys that wait while 16 statements of
// its Limiter are at the server go together, as one INSERT ... ON
// CONFLICT DO UPDATE over arrays (one round trip, one commit) that swaps
// each key only if it still holds the state its decision read and returns
// every key's outcome; it locks the rows in key order, so two batches
// never deadlock. Up to 16 statements in flight, each commit waits for a
// WAL flush that PostgreSQL shares among the commits waiting together, so
// holding them back for a batch would only add a wait; beyond, a batch
// costs less CPU per decision than as many statements (the client's, a
// third less): with fsync on, 1000 keys, 64 callers decide 1.2× as fast
// with 0.35 statements per decision, and 16 callers as before (see
// docs/performance.md). A statement the server refuses for a row's data
// or a conflict is made again key by key, so one key fails alone.
//
// A hot key (many callers on one key: a tenant's quota, an attacker) is
// decided by storelimit in rounds: one statement or two per round for all
// the calls of a process on the key, so the processes sharing a key race
// each other once per round rather than once per call. With fsync on, 8
// processes × 32 goroutines on one key limited to 1000/s admit their
// limit with about 0.1 statement per decision; see docs/performance.md.
// A key hotter than the database commits (thousands of calls a second, a
// commit of milliseconds) is for storelimit.NewLeasing: a process takes a
// batch of units in one statement and spends it without one.
//
// The decision is not made by a function in the database on purpose:
// it would be a second implementation of every algorithm (in PL/pgSQL),
// where the Go steps are tested against the in-process limiters.
//
// # Expiry and sweeping
//
// Expiry is the limiter's clock (see storelimit.Store), stored rounded up to
// PostgreSQL's microsecond; an expired row is invisible to reads and is
// overwritten by the next admission on its key. Rows of keys never seen
// again stay until Sweep deletes them: run it periodically (every minute,
// say) from one process. The index on expires keeps Sweep cheap.
//
// # Failures
//
// Every call runs under the Store's timeout (WithTimeout, one second by
// default) on top of the caller's context, and storelimit bounds a whole
// decision by it (the Store has a Timeout method), so an exhausted
// connection pool, a server that stopped answering or a key contended by
// other processes ends the decision within the timeout with an error,
// never a hang; storelimit wraps it in throttle.ErrUnavailable, and
// failsafe decides what that means. Committed states survive a restart of
// the server.
package pglimit

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/storelimit"
)

// DB is what the Store needs of a connection: a *pgxpool.Pool (the usual
// choice) or a *pgx.Conn (one connection, not for concurrent use).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// defaultTable is the table a Store uses unless WithTable names another.
const defaultTable = "throttle_state"

// maxKeyLen is the longest key stored as it is; a longer key is stored as
// its digest (see "The table").
const maxKeyLen = 1024

// defaultTimeout bounds each call of a Store unless WithTimeout says
// otherwise.
const defaultTimeout = time.Second

var _ storelimit.BatchStore = (*Store)(nil)

// Store is a storelimit.Store in one PostgreSQL table. It is safe for
// concurrent use when its DB is (a pool). The zero value is not usable;
// create it with New.
type Store struct {
	db      DB
	table   string
	timeout time.Duration
	load    string
	update  string
	insert  string
	batch   string
	sweep   string
}

// Option configures a Store.
type Option func(*Store)

// WithTable names the table (throttle_state by default; optionally
// schema-qualified, as schema.table; letters, digits and underscores).
func WithTable(name string) Option { return func(s *Store) { s.table = name } }

// WithTimeout bounds each call of the Store (1 s by default), including
// the wait for a connection from the pool; 0 leaves only the caller's
// context.
func WithTimeout(d time.Duration) Option { return func(s *Store) { s.timeout = d } }

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$`)

// New returns a Store over db. Errors wrap throttle.ErrInvalid: a nil db,
// a table name that is not an identifier, a negative timeout.
func New(db DB, opts ...Option) (*Store, error) {
	s := &Store{db: db, table: defaultTable, timeout: defaultTimeout}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: pglimit: nil Option", throttle.ErrInvalid)
		}
		o(s)
	}
	switch {
	case db == nil:
		return nil, fmt.Errorf("%w: pglimit.New: nil DB", throttle.ErrInvalid)
	case !identifier.MatchString(s.table):
		return nil, fmt.Errorf("%w: pglimit: table name %q is not an identifier", throttle.ErrInvalid, s.table)
	case s.timeout < 0:
		return nil, fmt.Errorf("%w: pglimit: negative timeout %v", throttle.ErrInvalid, s.timeout)
	}
	t := s.table
	s.load = "SELECT state FROM " + t + " WHERE key = $1 AND expires >= $2"
	// Each swap returns one row: whether it swapped, and if not the
	// key's state at now, read in the statement's snapshot.
	orState := func(now string) string {
		return " SELECT true, 0::bigint FROM w UNION ALL SELECT false, COALESCE((SELECT state FROM " + t +
			" WHERE key = $1 AND expires >= " + now + "), 0) WHERE NOT EXISTS (SELECT FROM w)"
	}
	// $1 key, $2 old, $3 next, $4 now, $5 expires
	s.update = "WITH w AS (UPDATE " + t + " SET state = $3, expires = $5" +
		" WHERE key = $1 AND state = $2 AND expires >= $4 RETURNING 1)" + orState("$4")
	// $1 key, $2 next, $3 now, $4 expires
	s.insert = "WITH w AS (INSERT INTO " + t + " AS t (key, state, expires) VALUES ($1, $2, $4)" +
		" ON CONFLICT (key) DO UPDATE SET state = excluded.state, expires = excluded.expires" +
		" WHERE t.expires < $3 OR t.state = 0 RETURNING 1)" + orState("$3")
	s.batch = batchSQL(t)
	s.sweep = "DELETE FROM " + t + " WHERE key IN (SELECT key FROM " + t +
		" WHERE expires < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)"
	return s, nil
}

// CreateTable creates the table and its index on expires if they do not
// exist. It is safe to call from many processes at once (replicas
// starting together): the calls on one table name take turns under a
// transaction-scoped advisory lock, since CREATE ... IF NOT EXISTS alone
// fails on a concurrent creation.
func (s *Store) CreateTable(ctx context.Context) error {
	idx := s.table[strings.LastIndexByte(s.table, '.')+1:] + "_expires"
	// One Exec of several statements without arguments is one implicit
	// transaction, which holds the lock to its end. The table name is
	// an identifier (checked by New), safe in a literal.
	_, err := s.db.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('throttle pglimit "+s.table+"'));"+
		" CREATE TABLE IF NOT EXISTS "+s.table+
		" (key bytea PRIMARY KEY, state bigint NOT NULL, expires timestamptz NOT NULL);"+
		" CREATE INDEX IF NOT EXISTS "+idx+" ON "+s.table+" (expires)")
	return err
}

// Load returns key's state at now, 0 when it has no live row.
func (s *Store) Load(ctx context.Context, key string, now int64) (int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var state int64
	err := s.db.QueryRow(ctx, s.load, dbKey(key), floorMicro(now)).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return state, err
}

// CompareAndSwap sets key's state to next, live until expires, if its
// state at now is old: one statement.
func (s *Store) CompareAndSwap(ctx context.Context, key string, old, next, now, expires int64) (bool, error) {
	_, ok, err := s.CompareAndSwapLoad(ctx, key, old, next, now, expires)
	return ok, err
}

// CompareAndSwapLoad is CompareAndSwap that returns key's state at now
// when it does not swap: one statement, and a SELECT after a
// serialization failure or a deadlock.
func (s *Store) CompareAndSwapLoad(ctx context.Context, key string, old, next, now, expires int64) (int64, bool, error) {
	bctx, cancel := s.bound(ctx)
	defer cancel()
	var row pgx.Row
	if old == 0 {
		row = s.db.QueryRow(bctx, s.insert, dbKey(key), next, floorMicro(now), ceilMicro(expires))
	} else {
		row = s.db.QueryRow(bctx, s.update, dbKey(key), old, next, floorMicro(now), ceilMicro(expires))
	}
	var swapped bool
	var state int64
	err := row.Scan(&swapped, &state)
	if conflict(err) {
		state, err = s.Load(ctx, key, now)
		return state, false, err
	}
	return state, err == nil && swapped, err
}

// batchSQL is the statement of CompareAndSwapBatch on table t: $1 keys,
// $2 old states, $3 next states, $4 nows, $5 expiries, one element per
// swap. Every swap is one INSERT ... ON CONFLICT DO UPDATE of its key, in
// key order (so two batches lock their rows in one order and never
// deadlock): a new key is inserted when its old state is 0; a row is
// updated only if it still holds the old state live at now (or, when the
// old state is 0, if it expired); a swap from a state other than 0 on a
// key without a row inserts an empty row (state 0, expired), as good as
// none, and does not swap. The statement returns two arrays in the
// order of the swaps: whether each swapped, and else the key's state at
// its now, read in the statement's snapshot as the single swaps do.
func batchSQL(t string) string {
	return "WITH a AS (SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bigint[], $4::timestamptz[], $5::timestamptz[])" +
		" WITH ORDINALITY AS a(key, old, next, now, exp, i))," +
		" w AS (INSERT INTO " + t + " AS t (key, state, expires)" +
		" SELECT key, CASE WHEN old = 0 THEN next ELSE 0 END, CASE WHEN old = 0 THEN exp ELSE '-infinity' END FROM a ORDER BY key" +
		" ON CONFLICT (key) DO UPDATE SET state = (SELECT a.next FROM a WHERE a.key = excluded.key)," +
		" expires = (SELECT a.exp FROM a WHERE a.key = excluded.key)" +
		" WHERE EXISTS (SELECT FROM a WHERE a.key = excluded.key AND CASE WHEN a.old = 0" +
		" THEN t.expires < a.now OR t.state = 0 ELSE t.state = a.old AND t.expires >= a.now END)" +
		" RETURNING t.key, t.expires)" +
		" SELECT array_agg(w.key IS NOT NULL AND w.expires > '-infinity' ORDER BY a.i)," +
		" array_agg(COALESCE((SELECT state FROM " + t + " WHERE key = a.key AND expires >= a.now), 0) ORDER BY a.i)" +
		" FROM a LEFT JOIN w USING (key)"
}

// CompareAndSwapBatch does each swap of swaps as CompareAndSwapLoad would,
// all in one statement (one round trip, one commit); see "Round trips
// and contention". When the server refuses the statement for its data or
// a conflict (SQLSTATE classes 22, 23 and 40: a row a constraint or a
// trigger refuses, a serialization failure under a stricter isolation, a
// deadlock), the statement was rolled back and each swap is made again
// alone, so that each gets its own outcome; any other error (a timeout, a
// lost connection) fails them all.
func (s *Store) CompareAndSwapBatch(ctx context.Context, swaps []storelimit.Swap) error {
	bctx, cancel := s.bound(ctx)
	defer cancel()
	keys := make([][]byte, len(swaps))
	olds, nexts := make([]int64, len(swaps)), make([]int64, len(swaps))
	nows, exps := make([]time.Time, len(swaps)), make([]time.Time, len(swaps))
	for i, w := range swaps {
		keys[i], olds[i], nexts[i] = dbKey(w.Key), w.Old, w.Next
		nows[i], exps[i] = floorMicro(w.Now), ceilMicro(w.Expires)
	}
	var swapped []bool
	var states []int64
	err := s.db.QueryRow(bctx, s.batch, keys, olds, nexts, nows, exps).Scan(&swapped, &states)
	if perRow(err) && bctx.Err() == nil {
		for i := range swaps {
			w := &swaps[i]
			w.State, w.Swapped, w.Err = s.CompareAndSwapLoad(ctx, w.Key, w.Old, w.Next, w.Now, w.Expires)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if len(swapped) != len(swaps) || len(states) != len(swaps) {
		return fmt.Errorf("pglimit: a batch of %d swaps returned %d outcomes", len(swaps), len(swapped))
	}
	for i := range swaps {
		swaps[i].Swapped, swaps[i].State = swapped[i], states[i]
	}
	return nil
}

// dbKey is key as stored: its bytes, or for a key longer than maxKeyLen
// its SHA-256 digest at the end of maxKeyLen+1 bytes starting with a
// mark.
func dbKey(key string) []byte {
	if len(key) <= maxKeyLen {
		return []byte(key)
	}
	b := make([]byte, maxKeyLen+1)
	copy(b, "throttle: SHA-256 of a long key\x00")
	sum := sha256.Sum256([]byte(key))
	copy(b[len(b)-len(sum):], sum[:])
	return b
}

// conflict reports whether err is PostgreSQL refusing the statement
// because of a concurrent writer: a serialization failure (under
// REPEATABLE READ or SERIALIZABLE, where READ COMMITTED would have waited)
// or a deadlock. The statement was rolled back, so the swap lost the race
// and the caller decides again, as after any lost compare-and-swap.
func conflict(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01")
}

// perRow reports whether err is the server refusing a statement for the
// data of its rows or a conflict with another writer (SQLSTATE classes
// 22, 23, 40), which the swaps of a batch made alone may not meet.
func perRow(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && len(pg.Code) == 5 && (pg.Code[:2] == "22" || pg.Code[:2] == "23" || pg.Code[:2] == "40")
}

// sweepBatch is how many rows one DELETE of Sweep removes at most, so
// that it holds few locks at a time.
const sweepBatch = 10000

// Sweep deletes the rows expired before before, in batches, and returns
// how many it deleted. Rows locked by a writer are left for the next
// Sweep. It is not bounded by the Store's timeout; ctx bounds it.
func (s *Store) Sweep(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	for {
		tag, err := s.db.Exec(ctx, s.sweep, before, sweepBatch)
		if err != nil {
			return n, err
		}
		n += tag.RowsAffected()
		if tag.RowsAffected() < sweepBatch {
			return n, nil
		}
	}
}

// Timeout reports the Store's timeout (WithTimeout): storelimit bounds
// each decision over the Store by it as a whole, however many statements
// the decision takes.
func (s *Store) Timeout() time.Duration { return s.timeout }

// bound returns ctx bounded by the Store's timeout, unless its deadline
// is already as early (a decision bounded as a whole by storelimit).
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout == 0 {
		return ctx, func() {}
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// floorMicro and ceilMicro turn nanoseconds into PostgreSQL's
// microseconds, rounding so that a state is never taken for expired
// before its time (a little after is harmless: a state past its expiry
// decides as a fresh one).
func floorMicro(ns int64) time.Time {
	us := ns / 1000
	if ns%1000 < 0 {
		us--
	}
	return time.UnixMicro(us)
}

func ceilMicro(ns int64) time.Time {
	if ns > math.MaxInt64-999 {
		return time.UnixMicro(math.MaxInt64 / 1000).Add(time.Microsecond)
	}
	return floorMicro(ns + 999)
}
