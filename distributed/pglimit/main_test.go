package pglimit_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/throttlekit/throttle/distributed/pglimit"
	"github.com/throttlekit/throttle/internal/pgtest"
	"github.com/throttlekit/throttle/internal/testproc"
)

// srv is the server the package's tests share (tests that kill a server
// start their own).
var srv *pgtest.Server

func TestMain(m *testing.M) {
	if hotChild() {
		return
	}
	os.Exit(testproc.ServerMain(m, pgtest.EnvRequire, pgtest.ErrNoServer, func() (func(), error) {
		s, err := pgtest.StartServer()
		if err != nil {
			return nil, err
		}
		srv = s
		return s.Close, nil
	}))
}

// newPool returns a pool of at most conns connections to s, closed at the
// end of the test.
func newPool(t testing.TB, s *pgtest.Server, conns int32) *pgxpool.Pool {
	t.Helper()
	return newPoolWith(t, s, conns, nil)
}

// newFastPool is newPool with synchronous_commit off: commits do not wait
// for their WAL flush, for the tests of decisions that make thousands of
// them (durability is TestServerKilled's).
func newFastPool(t testing.TB, s *pgtest.Server, conns int32) *pgxpool.Pool {
	t.Helper()
	return newPoolWith(t, s, conns, map[string]string{"synchronous_commit": "off"})
}

// newPoolWith is newPool with the server settings params for its
// connections.
func newPoolWith(t testing.TB, s *pgtest.Server, conns int32, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = conns
	maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

var tableSeq atomic.Int64

// newTableName returns a table name no other test uses.
func newTableName() string { return fmt.Sprintf("t%d_%d", os.Getpid(), tableSeq.Add(1)) }

// newStore returns a Store over a table of its own in db.
func newStore(t testing.TB, db pglimit.DB, opts ...pglimit.Option) *pglimit.Store {
	t.Helper()
	return newStoreOn(t, db, newTableName(), opts...)
}

// newStoreOn returns a Store over the table name in db, created if need be.
func newStoreOn(t testing.TB, db pglimit.DB, name string, opts ...pglimit.Option) *pglimit.Store {
	t.Helper()
	s, err := pglimit.New(db, append([]pglimit.Option{pglimit.WithTable(name)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTable(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}
