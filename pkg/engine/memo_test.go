package engine

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// mapMemo is a Memo in memory. A Set with its context ended writes nothing,
// as a write to the state that never reached it.
type mapMemo struct {
	mu sync.Mutex
	m  map[string]string
	// refuse, when set, is what every Set fails with (a state write refused).
	refuse error
}

func newMemo() *mapMemo { return &mapMemo{m: map[string]string{}} }

func (m *mapMemo) Get(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	v, ok := m.m[key]

	return v, ok
}

func (m *mapMemo) Set(ctx context.Context, key, value string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write the state: %w", err)
	}

	m.mu.Lock()
	defer m.mu.Unlock()

	if m.refuse != nil {
		return fmt.Errorf("write the state: %w", m.refuse)
	}

	m.m[key] = value

	return nil
}

func (m *mapMemo) all() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()

	return maps.Clone(m.m)
}
