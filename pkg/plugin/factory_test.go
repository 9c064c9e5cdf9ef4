package plugin

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

// closingTalos counts its Close calls.
type closingTalos struct {
	*discoverytest.FakeTalos
	closed *int
}

func (c closingTalos) Close() error {
	*c.closed++

	return nil
}

// An upgrade plans (discovery, etcd, manifests) and then works out the Job's access to
// the bootstrap manifests: one Talos connection serves both, closed once when the
// command ends.
func TestUpgradeOpensOneTalosConnection(t *testing.T) {
	c := newJobCluster(talosSecret())
	d := fakeDeps(fixture(), nil)

	opened, closed := 0, 0
	d.talos = func(context.Context, TalosFlags) (discovery.TalosReader, error) {
		opened++

		return closingTalos{FakeTalos: fixture().Talos(), closed: &closed}, nil
	}

	_, stderr, code := runWith(t, c.with(d), "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
	require.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, 1, opened, "Talos connections opened")
	assert.Equal(t, 1, closed, "Talos connections closed")
}

// A flag's own error comes before any connection: the factory builds clients on first use.
func TestFlagErrorsBeforeConnecting(t *testing.T) {
	d := fakeDeps(fixture(), nil)
	connected := false
	d.talos = func(context.Context, TalosFlags) (discovery.TalosReader, error) {
		connected = true

		return fixture().Talos(), nil
	}

	_, stderr, code := runWith(t, d, "plan", "kubernetes", "--to", "1.36")
	assert.Equal(t, ExitError, code)
	assert.Contains(t, stderr, "error: --to: ")
	assert.False(t, connected)
}
