package engine

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// recorder is a Progress that keeps every call and can stop the engine
// after a given number of them.
type recorder struct {
	mu     sync.Mutex
	lines  []string
	count  int
	stopAt int
	cancel context.CancelFunc
	// onLine, when set, sees each line once it is kept (outside the lock).
	onLine func(line string)
}

func (r *recorder) Stage(index, total int, name string) {
	r.add(fmt.Sprintf("stage %d/%d %s", index, total, name))
}

func (r *recorder) Node(stage, node string, phase NodePhase, message string) {
	if strings.Contains(message, "\n") {
		panic("a progress message spans lines: " + message)
	}

	r.add(fmt.Sprintf("%s %s %s: %s", stage, node, phase, message))
}

func (r *recorder) Step(stage, step, message string) {
	r.add(fmt.Sprintf("%s [%s] %s", stage, step, message))
}

func (r *recorder) StepTime(stage, step string, t StepTiming) {
	r.add(fmt.Sprintf("%s [%s] time done=%t pods=%d updated=%d maxUnavailable=%d", stage, step, t.Done, t.Pods, t.Updated, t.MaxUnavailable))
}

func (r *recorder) add(line string) {
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.count++

	if r.stopAt > 0 && r.count == r.stopAt && r.cancel != nil {
		r.cancel()
	}

	onLine := r.onLine
	r.mu.Unlock()

	if onLine != nil {
		onLine(line)
	}
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()

	return append([]string(nil), r.lines...)
}

// with returns the recorded lines containing every one of words.
func (r *recorder) with(words ...string) []string {
	var out []string

	for _, l := range r.all() {
		ok := true

		for _, w := range words {
			if !strings.Contains(l, w) {
				ok = false
			}
		}

		if ok {
			out = append(out, l)
		}
	}

	return out
}
