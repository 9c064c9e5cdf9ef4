package engine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTalosABFallback(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.setFaults("worker-1", func(f *osFaults) { f.abFallback = true })

	memo := newMemo()

	err := o.engine("v1.13.9", memo).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "worker-1",
		`node "worker-1": A/B fallback: it rebooted (boot ID changed) but runs Talos v1.12.4, not v1.13.9`,
		"the new version did not boot", "the node stays cordoned")
	assert.Contains(t, p.Action, "talosctl -n 10.0.0.21 dmesg")
	assert.Contains(t, p.Action, "kubectl ichor resume")
	assert.Contains(t, p.Action, "kubectl ichor abort")

	assert.Equal(t, []string{"worker-1"}, o.f.cordonedByIchor())
	assert.Equal(t, "v1.12.4", o.state("worker-2").version, "nothing after the fallback")
	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3", "worker-1"}, o.upgradeNodes())

	// The operator looked; resume tries the node's upgrade again.
	o.setFaults("worker-1", func(f *osFaults) { f.abFallback = false })

	require.NoError(t, o.engine("v1.13.9", memo).Run(context.Background()))
	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-1", "worker-2"}, o.upgradeNodes())
	assert.Equal(t, "v1.13.9", o.state("worker-1").version)
	assert.Empty(t, o.f.cordonedByIchor())
}

func TestTalosNeverComesBack(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.setFaults("worker-1", func(f *osFaults) { f.neverBoots = true })

	memo := newMemo()
	start := time.Now()

	err := o.engine("v1.13.9", memo, func(opts *Options) { opts.RebootTimeout = 300 * time.Millisecond }).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "worker-1",
		"did not come back on Talos v1.13.9 within 300ms of its Upgrade call: rebooting: Talos API unreachable",
		"connection refused", "the node stays cordoned")
	assert.Contains(t, p.Action, "talosctl -n 10.0.0.21 dmesg")
	assert.Less(t, time.Since(start), 5*time.Second, "bounded by RebootTimeout")
	assert.Equal(t, []string{"worker-1"}, o.f.cordonedByIchor())
	assert.Equal(t, "v1.12.4", o.state("worker-2").version)

	// It comes back; resume verifies it without calling Upgrade again.
	o.setFaults("worker-1", func(f *osFaults) { f.neverBoots = false })

	require.NoError(t, o.engine("v1.13.9", memo).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Equal(t, 1, count(o.upgradeNodes(), "worker-1"))
}
