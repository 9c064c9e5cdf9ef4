package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// talosDrainer does what Talos does around an upgrade's reboot: cordon and
// drain the node before (five-minute bound, DaemonSet and mirror pods
// skipped), uncordon it once it is back.
type talosDrainer struct {
	client kubernetes.Interface
	log    *slog.Logger

	mu       sync.Mutex
	cordoned map[string]bool
}

func (d *talosDrainer) beforeReboot(node string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var out bytes.Buffer
		h := &drain.Helper{
			Ctx:                 ctx,
			Client:              d.client,
			Force:               true,
			GracePeriodSeconds:  -1,
			IgnoreAllDaemonSets: true,
			DeleteEmptyDirData:  true,
			Timeout:             5 * time.Minute,
			Out:                 &out,
			ErrOut:              &out,
		}
		n, err := d.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("cordon %s: %w", node, err)
		}
		if !n.Spec.Unschedulable {
			if err := drain.RunCordonOrUncordon(h, n, true); err != nil {
				return fmt.Errorf("cordon %s: %w", node, err)
			}
			d.mu.Lock()
			if d.cordoned == nil {
				d.cordoned = map[string]bool{}
			}
			d.cordoned[node] = true
			d.mu.Unlock()
		}
		if err := drain.RunNodeDrain(h, node); err != nil {
			return fmt.Errorf("drain %s: %w", node, err)
		}
		d.log.Info("talos drained the node for its upgrade", "node", node)
		return nil
	}
}

// uncordonAfterBoot uncordons a node the drainer cordoned, once its machine
// is up again.
func (d *talosDrainer) uncordonAfterBoot(ctx context.Context, m *machine.Machine) {
	ch, cancel := m.Subscribe()
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		st := m.State()
		d.mu.Lock()
		mine := d.cordoned[m.Name()]
		d.mu.Unlock()
		if !st.Up || !mine {
			continue
		}
		n, err := d.client.CoreV1().Nodes().Get(ctx, m.Name(), metav1.GetOptions{})
		if err != nil {
			continue
		}
		if err := drain.RunCordonOrUncordon(&drain.Helper{Ctx: ctx, Client: d.client}, n, false); err != nil {
			d.log.Info("uncordon after boot", "node", m.Name(), "err", err)
			continue
		}
		d.mu.Lock()
		delete(d.cordoned, m.Name())
		d.mu.Unlock()
	}
}
