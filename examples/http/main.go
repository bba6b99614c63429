// Command http is a small API limited the way a production service would
// be: a per-client limit on every route, a concurrency cap on an expensive
// endpoint, a per-API-key limit shared through Redis when REDIS_ADDR is
// set, and an outbound call to a partner API at most once every 6 s.
//
//	go run ./examples/http            # listens on 127.0.0.1:8080
//	curl -i localhost:8080/hello
//
// Behind a reverse proxy, say which header it writes, or every client
// shares the proxy's address: TRUST_PROXY=X-Forwarded-For for nginx's
// proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for (the
// address nginx saw is the rightmost; what a client wrote to the left is
// never read).
//
//	curl -i localhost:8080/report     # at most 2 at a time
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttle"
	"github.com/throttlekit/throttle/counting"
	"github.com/throttlekit/throttle/distributed/redislimit"
	"github.com/throttlekit/throttle/httplimit"
	"github.com/throttlekit/throttle/tokenbucket"
)

func main() {
	addr := "127.0.0.1:8080"
	if a := os.Getenv("ADDR"); a != "" {
		addr = a
	}
	var keyOpts []httplimit.IPOption
	if header := os.Getenv("TRUST_PROXY"); header != "" {
		keyOpts = append(keyOpts, httplimit.TrustProxy(header, 1))
	}
	h, closeAll, err := newHandler(os.Getenv("REDIS_ADDR"), keyOpts...)
	if err != nil {
		log.Fatal(err)
	}
	defer closeAll()
	log.Printf("listening on %s", addr)
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// newHandler builds the service; redisAddr "" keeps every limit local.
// keyOpts say where the client's address is read (default: the
// connection's peer).
func newHandler(redisAddr string, keyOpts ...httplimit.IPOption) (http.Handler, func(), error) {
	s := &service{mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	clientLimit, err := s.perClient(keyOpts)
	if err == nil {
		err = s.reports()
	}
	if err == nil && redisAddr != "" {
		err = s.api(redisAddr)
	}
	if err == nil {
		err = s.partner()
	}
	if err != nil {
		s.close()
		return nil, nil, err
	}
	return clientLimit(s.mux), s.close, nil
}

// service is the routes of the example and what to close when it stops.
type service struct {
	mux     *http.ServeMux
	closers []func() error
}

func (s *service) close() {
	for _, c := range s.closers {
		_ = c()
	}
}

// perClient is the middleware around every route: 10 requests a second
// per client, bursts of 20; the client is the connection's peer, or what
// the trusted proxy wrote (keyOpts).
func (s *service) perClient(keyOpts []httplimit.IPOption) (func(http.Handler) http.Handler, error) {
	perClient, err := tokenbucket.New(throttle.PerSecond(10), 20)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, perClient.Close)
	return httplimit.New(perClient, httplimit.WithName("per-client"),
		httplimit.WithKey(httplimit.ClientIP(keyOpts...)))
}

// reports serves GET /report, at most 2 at a time per client: held while
// the handler runs.
func (s *service) reports() error {
	reports, err := counting.New(2)
	if err != nil {
		return err
	}
	s.closers = append(s.closers, reports.Close)
	reportLimit, err := httplimit.New(reports, httplimit.WithName("reports"))
	if err != nil {
		return err
	}
	s.mux.Handle("GET /report", reportLimit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond) // an expensive query
		fmt.Fprintln(w, "report")
	})))
	return nil
}

// api serves GET /api/, 1000 requests an hour per API key, fleet-wide
// through the Redis at redisAddr.
func (s *service) api(redisAddr string) error {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	s.closers = append(s.closers, rdb.Close)
	perKey, err := redislimit.NewTokenBucket(rdb, throttle.NewRate(1000, time.Hour), 100)
	if err != nil {
		return err
	}
	keyLimit, err := httplimit.New(perKey, httplimit.WithName("per-key"),
		httplimit.WithKey(httplimit.Header("X-API-Key")))
	if err != nil {
		return err
	}
	s.mux.Handle("GET /api/", keyLimit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "api")
	})))
	return nil
}

// partner serves GET /partner, which calls a partner API that takes one
// call every 6 s per token: it waits for the turn.
func (s *service) partner() error {
	partner, err := tokenbucket.New(throttle.NewRate(1, 6*time.Second), 1)
	if err != nil {
		return err
	}
	s.closers = append(s.closers, partner.Close)
	client := &http.Client{Transport: &httplimit.Transport{Limiter: partner, Wait: true,
		Key: func(*http.Request) string { return "partner-token-1" }}}
	s.mux.HandleFunc("GET /partner", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+r.Host+"/hello", nil)
		resp, err := client.Do(req)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			http.Error(w, "partner busy, try later", http.StatusServiceUnavailable)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		fmt.Fprintln(w, "partner said", resp.Status)
	})
	return nil
}
