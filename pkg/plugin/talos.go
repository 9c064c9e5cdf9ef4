package plugin

import (
	"context"
	"errors"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// connectTalos opens the Talos client the flags name.
//
// It stands in for talos.Open until pkg/talos lands: until then it says so.
func connectTalos(context.Context, TalosFlags) (discovery.TalosReader, error) {
	return nil, errors.New("this build has no Talos client yet (pkg/talos): build from a newer commit")
}
