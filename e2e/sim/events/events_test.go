package events

import (
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLogWritesOneLinePerStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	l, err := Open(path)
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Start("cp-1", APIServer, "v1.36."+string(rune('0'+i%10)))
		}()
	}
	wg.Wait()
	l.Start("worker-1", Kubelet, "v1.36.3")
	l.Start("worker-1", Kubelet, "v1.36.3")
	require.NoError(t, l.Close())

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	line := regexp.MustCompile(`^\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z","node":"[a-z0-9-]+","component":"[a-z-]+","version":"v[0-9.]+"\}$`)
	lines := regexp.MustCompile("\n").Split(string(raw[:len(raw)-1]), -1)
	require.Len(t, lines, 52, "a restart at the same version is a start too")
	for _, l := range lines {
		require.Regexp(t, line, l)
	}
	ev, err := Read(path)
	require.NoError(t, err)
	require.Len(t, ev, 52)
	require.Equal(t, Event{Time: ev[51].Time, Node: "worker-1", Component: Kubelet, Version: "v1.36.3"}, ev[51])
	for i := 1; i < len(ev); i++ {
		require.False(t, ev[i].Time.Before(ev[i-1].Time), "lines are in time order")
	}
}

func TestNilLogRecordsNothing(t *testing.T) {
	var l *Log
	l.Start("cp-1", Talos, "v1.13.9")
	require.NoError(t, l.Close())
}
