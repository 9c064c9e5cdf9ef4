package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/planning"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// requestStats counts the requests a command makes to the Kubernetes API (every HTTP
// request of its clients) and to the Talos API (every call, by method and node), for the
// hidden --request-stats flag: how a command's cost grows with the cluster is visible
// without a profiler. It is safe for concurrent use.
type requestStats struct {
	// byResource counts Kubernetes requests by verb and resource, an object's name
	// replaced by {name} and watches apart ("WATCH /api/v1/nodes", "GET
	// /api/v1/nodes/{name}"), rather than by method and path: for a long run that
	// reads many objects by name.
	byResource bool

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
			key := req.Method + " " + req.URL.Path
			if s.byResource {
				key = resourceKey(req)
			}

			s.mu.Lock()
			s.kube[key]++
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

	if node != "" {
		s.talosNodes[node] = true
	}
}

// talosDialOptions make a Talos client count every call it makes, by service and method
// ("MachineService/ApplyConfiguration", "State/Get") and by the node the call is for (its
// "node" metadata).
func (s *requestStats) talosDialOptions() []grpc.DialOption {
	count := func(ctx context.Context, method string) {
		node := ""
		if md, ok := metadata.FromOutgoingContext(ctx); ok {
			if v := md.Get("node"); len(v) > 0 {
				node = v[0]
			}
		}

		if i := strings.LastIndex(method, "."); i >= 0 {
			method = method[i+1:] // "/machine.MachineService/Version" -> "MachineService/Version"
		}

		s.talosCall(method, node)
	}

	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			count(ctx, method)

			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			count(ctx, method)

			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// resourceKey is a request's verb and resource: "WATCH /api/v1/nodes", "GET
// /api/v1/nodes/{name}", "PUT /api/v1/namespaces/ichor-system/configmaps/{name}",
// "POST /api/v1/namespaces/default/pods/{name}/eviction". Namespaces stay: they say
// whose objects were read.
func resourceKey(req *http.Request) string {
	verb := req.Method
	if req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true" {
		verb = "WATCH"
	}

	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")

	var prefix int // the segments before the resource: api/v1 or apis/group/version

	switch {
	case len(parts) >= 2 && parts[0] == "api":
		prefix = 2
	case len(parts) >= 3 && parts[0] == "apis":
		prefix = 3
	default:
		return verb + " " + req.URL.Path
	}

	rest := parts[prefix:]
	if len(rest) >= 3 && rest[0] == "namespaces" {
		prefix += 2
		rest = rest[2:]
	}

	if len(rest) >= 2 {
		rest[1] = "{name}"
	}

	return verb + " /" + strings.Join(append(parts[:prefix:prefix], rest...), "/")
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

// The optional readers (system extensions, bootstrap manifests, etcd) are counted and
// forwarded when the wrapped reader has them; capable says whether it has, so that
// counting changes nothing of what a command reads.

// Installed counts and forwards the call when the wrapped reader can make it.
func (c *countingTalos) Installed(ctx context.Context, node string) (talos.Installed, error) {
	c.stats.talosCall("Installed", node)

	r, ok := c.TalosReader.(discovery.InstalledReader)
	if !ok {
		return talos.Installed{}, errors.New("this Talos client cannot read system extensions")
	}

	return r.Installed(ctx, node)
}

// PersistentMachineConfig counts and forwards the call when the wrapped reader can make it.
func (c *countingTalos) PersistentMachineConfig(ctx context.Context, node string) (config.Provider, error) {
	c.stats.talosCall("PersistentMachineConfig", node)

	r, ok := c.TalosReader.(discovery.PersistentReader)
	if !ok {
		return nil, errors.New("this Talos client cannot read persistent machine configs")
	}

	return r.PersistentMachineConfig(ctx, node)
}

// Manifests counts and forwards the call when the wrapped reader can make it.
func (c *countingTalos) Manifests(ctx context.Context, node string) ([]*unstructured.Unstructured, error) {
	c.stats.talosCall("Manifests", node)

	r, ok := c.TalosReader.(planning.ManifestReader)
	if !ok {
		return nil, errors.New("this Talos client cannot read the bootstrap manifests")
	}

	return r.Manifests(ctx, node)
}

// EtcdMembers counts and forwards the call when the wrapped reader can make it.
func (c *countingTalos) EtcdMembers(ctx context.Context, node string) ([]talos.EtcdMember, error) {
	c.stats.talosCall("EtcdMemberList", node)

	r, ok := c.TalosReader.(stages.EtcdReader)
	if !ok {
		return nil, errNoEtcdReader
	}

	return r.EtcdMembers(ctx, node)
}

// EtcdStatus counts and forwards the call when the wrapped reader can make it.
func (c *countingTalos) EtcdStatus(ctx context.Context, node string) (talos.EtcdStatus, error) {
	c.stats.talosCall("EtcdStatus", node)

	r, ok := c.TalosReader.(stages.EtcdReader)
	if !ok {
		return talos.EtcdStatus{}, errNoEtcdReader
	}

	return r.EtcdStatus(ctx, node)
}

// EtcdAlarms counts and forwards the call when the wrapped reader can make it.
func (c *countingTalos) EtcdAlarms(ctx context.Context, node string) ([]talos.EtcdAlarm, error) {
	c.stats.talosCall("EtcdAlarmList", node)

	r, ok := c.TalosReader.(stages.EtcdReader)
	if !ok {
		return nil, errNoEtcdReader
	}

	return r.EtcdAlarms(ctx, node)
}

var errNoEtcdReader = errors.New("this Talos client cannot read etcd")

// Unwrap is the reader counted: planning.Capable uses it for the calls it can make.
func (c *countingTalos) Unwrap() discovery.TalosReader { return c.TalosReader }

// Close closes the wrapped reader when it is an io.Closer.
func (c *countingTalos) Close() error {
	if closer, isCloser := c.TalosReader.(io.Closer); isCloser {
		return closer.Close()
	}

	return nil
}
