package capacity

import (
	"context"
	"errors"
	"testing"
)

func TestSolo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var got []Leadership
	done := make(chan error)
	go func() {
		done <- Solo{}.Campaign(ctx, "10.0.0.1:7000", func(l Leadership) { got = append(got, l) })
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Campaign = %v, want context.Canceled", err)
	}
	want := Leadership{Master: "10.0.0.1:7000", IsMaster: true, Term: 1}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("reports %+v, want [%+v]", got, want)
	}
}
