package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo starts a line echo server on loopback, closed at the end of the
// test, and returns its address.
func echo(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// ask sends a line through c and returns the echo, or "" when none comes
// within wait.
func ask(t *testing.T, c net.Conn, r *bufio.Reader, wait time.Duration) string {
	t.Helper()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	line, _ := r.ReadString('\n')
	return line
}

func TestFaults(t *testing.T) {
	p := New(t, "http://"+echo(t))
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got := ask(t, c, r, time.Second); got != "ping\n" {
		t.Fatalf("pass: %q", got)
	}

	p.Set(Hang)
	if got := ask(t, c, r, 200*time.Millisecond); got != "" {
		t.Fatalf("hang let %q through", got)
	}
	p.Set(Pass) // what was held arrives
	c.SetReadDeadline(time.Now().Add(time.Second))
	if got, _ := r.ReadString('\n'); got != "ping\n" {
		t.Fatalf("held request after Hang: %q", got)
	}

	p.Set(LateAnswers(300 * time.Millisecond))
	start := time.Now()
	if got := ask(t, c, r, 2*time.Second); got != "ping\n" || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("late answer %q after %v", got, time.Since(start))
	}

	p.Set(DropAnswers)
	if got := ask(t, c, r, 200*time.Millisecond); got != "" {
		t.Fatalf("dropped answer arrived: %q", got)
	}
	p.Set(Pass) // leaving DropAnswers closes the connections
	c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("connection survived leaving DropAnswers")
	}

	c2, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got := ask(t, c2, bufio.NewReader(c2), time.Second); got != "ping\n" {
		t.Fatalf("new connection: %q", got)
	}
	p.Set(Hang)
	c2.Write([]byte("held\n"))
	p.Close() // closes while hanging
	p.Close() // and is idempotent
}
