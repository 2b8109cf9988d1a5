package bolt

import (
	"context"
	"testing"
	"time"

	"github.com/starintel/starlease/internal/layered"
)

// With a flush interval, a batch runs its functions while the batch
// before it waits for its redo append (the pipeline), yet neither is
// answered or shown to readers before its own record is durable, and
// the second is not answered before the first.
func TestEnginePipelineOverlapsAppendWithNextBatch(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t, Options{ReapInterval: -1, FlushInterval: time.Hour})
	e := s.group.engine
	held := make(chan int, 4)
	release, ended := make(chan struct{}), make(chan struct{})
	e.appendHook = func(id int) {
		select {
		case held <- id:
		case <-ended:
			return
		}
		select {
		case <-release:
		case <-ended:
		}
	}
	// Before the store's Close (cleanups run last first): a failing test
	// must not leave an append held.
	t.Cleanup(func() { close(ended) })
	put := func(key string, inFn func()) chan error {
		done := make(chan error, 1)
		go func() {
			done <- s.mutate(ctx, func(tx *layered.View) error {
				if inFn != nil {
					inFn()
				}
				return tx.Bucket(bucketMeta).Put([]byte(key), []byte("v"))
			})
		}()
		return done
	}
	read := func(key string) bool {
		var found bool
		if err := s.view(ctx, func(tx *layered.View) error {
			found = tx.Bucket(bucketMeta).Get([]byte(key)) != nil
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return found
	}
	// The first write's function waits until the second is queued, so
	// the first batch finds a write waiting and hands its append over.
	inFirst, goOn := make(chan struct{}), make(chan struct{})
	first := put("pipeline-1", func() { close(inFirst); <-goOn })
	<-inFirst
	secondRan := make(chan struct{})
	second := put("pipeline-2", func() { close(secondRan) })
	for s.group.queue.Queued() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(goOn)
	firstID := <-held
	select {
	case <-secondRan:
	case <-time.After(10 * time.Second):
		t.Fatal("the second batch did not run its functions while the first waited for its append")
	}
	if read("pipeline-1") || read("pipeline-2") {
		t.Fatal("a reader sees a write whose redo record is not appended yet")
	}
	select {
	case err := <-first:
		t.Fatalf("the first write was answered (%v) before its append", err)
	case err := <-second:
		t.Fatalf("the second write was answered (%v) before any append", err)
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{} // the first append goes on
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if !read("pipeline-1") || read("pipeline-2") {
		t.Fatal("after the first append readers must see the first write and not the second")
	}
	if id := <-held; id != firstID+1 {
		t.Fatalf("the second append is batch %d, want %d", id, firstID+1)
	}
	release <- struct{}{}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if !read("pipeline-2") {
		t.Fatal("the second write is not visible after its append")
	}
}
