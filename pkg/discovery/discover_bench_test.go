package discovery_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

// slowTalos answers after a delay, as a Talos API behind apid on a network does.
type slowTalos struct {
	discovery.TalosReader

	latency time.Duration
}

func (s slowTalos) Version(ctx context.Context, node string) (string, error) {
	time.Sleep(s.latency)

	return s.TalosReader.Version(ctx, node)
}

func (s slowTalos) MachineConfig(ctx context.Context, node string) (config.Provider, error) {
	time.Sleep(s.latency)

	return s.TalosReader.MachineConfig(ctx, node)
}

// BenchmarkDiscoverTalosLatency discovers 1000 nodes whose Talos API answers in 5 ms, at
// several bounds of calls in flight: the local simulated cluster has no network latency,
// so its benchmark cannot show what the bound costs on a real cluster.
func BenchmarkDiscoverTalosLatency(b *testing.B) {
	c := discoverytest.New()
	for i := range 3 {
		c.ControlPlane(fmt.Sprintf("cp-%d", i+1), fmt.Sprintf("10.0.0.%d", i+1))
	}

	for i := range 997 {
		c.Worker(fmt.Sprintf("worker-%d", i+1), fmt.Sprintf("10.1.%d.%d", i/250, i%250+1))
	}

	cs, talos := c.Clientset(), c.Talos()

	for _, limit := range []int{10, discovery.DefaultConcurrency} {
		b.Run(fmt.Sprintf("concurrency-%d", limit), func(b *testing.B) {
			d := &discovery.Discoverer{Kube: cs, Endpoint: discoverytest.Endpoint, Talos: slowTalos{talos, 5 * time.Millisecond}, Concurrency: limit}

			for b.Loop() {
				if _, err := d.Discover(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
