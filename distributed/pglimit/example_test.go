package pglimit_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/distributed/pglimit"
	"github.com/throttlekit/throttle/storelimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

// A token bucket per key shared by every process that reaches the
// database, with its own table, a bound of 200ms per query, and expired
// rows swept every minute.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pglimit.New(pool, pglimit.WithTable("api_limits"), pglimit.WithTimeout(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	go func() {
		for range time.Tick(time.Minute) {
			if _, err := store.Sweep(ctx, time.Now()); err != nil {
				log.Print(err)
			}
		}
	}()
	alg, err := tokenbucket.NewAlgorithm(throttle.PerSecond(10), 20)
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := storelimit.New(store, alg)
	if err != nil {
		log.Fatal(err)
	}
	d, err := limiter.Allow(ctx, "user:42", 1)
	log.Println(d.Allowed, err)
}
