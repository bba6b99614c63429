package gossip

import (
	"sync"
	"testing"
)

// TestDirtyConcurrent: entries added from many goroutines while rounds
// take them (chunks filling up and being replaced meanwhile) are each
// taken exactly once.
func TestDirtyConcurrent(t *testing.T) {
	const workers, each = 4, 20_000
	var d dirty
	d.init()
	es := make([]entry, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w * each; i < (w+1)*each; i++ {
				d.add(&es[i])
			}
		})
	}
	stop := make(chan struct{})
	var taken []*entry
	var tk sync.WaitGroup
	tk.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				taken = d.take(taken)
			}
		}
	})
	wg.Wait()
	close(stop)
	tk.Wait()
	taken = d.take(taken)
	index := map[*entry]int{}
	for i := range es {
		index[&es[i]] = i
	}
	count := make([]int, len(es))
	for _, e := range taken {
		count[index[e]]++
	}
	for i, c := range count {
		if c != 1 {
			t.Fatalf("entry %d taken %d times (%d taken in all, %d added)", i, c, len(taken), len(es))
		}
	}
}
