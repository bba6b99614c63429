module github.com/throttlekit/throttle/distributed/pglimit

go 1.25.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/throttlekit/throttle v0.1.0
	github.com/throttlekit/throttle/distributed/redislimit v0.1.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace (
	github.com/throttlekit/throttle => ../..
	github.com/throttlekit/throttle/distributed/redislimit => ../redislimit
)
