package job

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// Wake paces a loop that reads one object: Next returns at the object's next
// change (a watch on it by name), or once the loop's poll passed. A watch that
// ends is opened again, and that turn waits the poll; a watch that cannot start
// (RBAC refusing it, say) leaves the poll alone. Opened before the loop's first
// read, it misses no change after that read.
type Wake struct {
	open   func(context.Context, metav1.ListOptions) (watch.Interface, error)
	name   string
	events <-chan watch.Event
	stop   func()
}

// newWake starts watching the object called name with open.
func newWake(ctx context.Context, open func(context.Context, metav1.ListOptions) (watch.Interface, error), name string) *Wake {
	w := &Wake{open: open, name: name}
	w.start(ctx)

	return w
}

func (w *Wake) start(ctx context.Context) {
	w.events, w.stop = nil, func() {}

	iw, err := w.open(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", w.name).String()})
	if err == nil {
		w.events, w.stop = iw.ResultChan(), iw.Stop
	}
}

// Next returns at the object's next change, once poll passed, or when ctx ends.
func (w *Wake) Next(ctx context.Context, poll time.Duration) {
	timer := time.NewTimer(poll)
	defer timer.Stop()

	select {
	case <-ctx.Done():
	case _, open := <-w.events:
		if open {
			return
		}

		w.stop()
		w.start(ctx)

		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	case <-timer.C:
	}
}

// Stop ends the watch.
func (w *Wake) Stop() { w.stop() }
