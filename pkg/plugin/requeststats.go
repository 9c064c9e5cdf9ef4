package plugin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// requestStats counts the requests a command makes to the Kubernetes API (every HTTP
// request of its clients) and to the Talos API (every call, by method and node), for the
// hidden --request-stats flag: how a command's cost grows with the cluster is visible
// without a profiler. It is safe for concurrent use.
type requestStats struct {
	mu         sync.Mutex
	kube       map[string]int // "GET /api/v1/nodes"
	talos      map[string]int // "MachineConfig"
	talosNodes map[string]bool
}

func newRequestStats() *requestStats {
	return &requestStats{kube: map[string]int{}, talos: map[string]int{}, talosNodes: map[string]bool{}}
}

// wrapKube makes every client built from cfg count its requests.
func (s *requestStats) wrapKube(cfg *rest.Config) *rest.Config {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			s.mu.Lock()
			s.kube[req.Method+" "+req.URL.Path]++
			s.mu.Unlock()

			return rt.RoundTrip(req)
		})
	})

	return cfg
}

// wrapTalos makes r count its calls.
func (s *requestStats) wrapTalos(r discovery.TalosReader) discovery.TalosReader {
	return &countingTalos{TalosReader: r, stats: s}
}

func (s *requestStats) talosCall(method, node string) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.talos[method]++
	s.talosNodes[node] = true
}

// print writes two lines: the Kubernetes requests and the Talos calls, with totals.
func (s *requestStats) print(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()

	kube, kubeTotal := breakdown(s.kube)
	talos, talosTotal := breakdown(s.talos)

	fmt.Fprintf(w, "request stats: kubernetes %d requests (%s)\n", kubeTotal, kube)
	fmt.Fprintf(w, "request stats: talos %d calls to %d nodes (%s)\n", talosTotal, len(s.talosNodes), talos)
}

// breakdown lists counts by key, sorted, and their sum.
func breakdown(counts map[string]int) (string, int) {
	keys := make([]string, 0, len(counts))
	total := 0

	for k, n := range counts {
		keys = append(keys, k)
		total += n
	}

	sort.Strings(keys)

	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}

	return strings.Join(parts, ", "), total
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// countingTalos counts the calls to a TalosReader; it closes what it wraps.
type countingTalos struct {
	discovery.TalosReader

	stats *requestStats
}

func (c *countingTalos) Version(ctx context.Context, node string) (string, error) {
	c.stats.talosCall("Version", node)

	return c.TalosReader.Version(ctx, node)
}

func (c *countingTalos) MachineConfig(ctx context.Context, node string) (config.Provider, error) {
	c.stats.talosCall("MachineConfig", node)

	return c.TalosReader.MachineConfig(ctx, node)
}

// Close closes the wrapped reader when it is an io.Closer.
func (c *countingTalos) Close() error {
	if closer, isCloser := c.TalosReader.(io.Closer); isCloser {
		return closer.Close()
	}

	return nil
}
