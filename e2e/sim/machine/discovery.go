package machine

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"sync"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	machinetype "github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
)

// Discovery is the cluster discovery service the machines of one cluster
// share (Talos' discovery service registry): a machine publishes its
// affiliate (node ID, hostname, addresses, machine type, "Talos (vX.Y.Z)")
// when it boots, and every machine whose config enables discovery holds a
// Member resource (cluster namespace, ID its Kubernetes node name) for each
// affiliate, as Talos' MemberController writes them. A machine that is down
// keeps its affiliate: the service holds the data for 30 minutes, longer
// than a reboot. A nil *Discovery is a cluster without the service: the
// machines have no members. It is safe for concurrent use.
type Discovery struct {
	mu         sync.Mutex
	affiliates map[string]cluster.MemberSpec // by node name
	machines   []*Machine
}

// NewDiscovery returns an empty discovery service.
func NewDiscovery() *Discovery {
	return &Discovery{affiliates: map[string]cluster.MemberSpec{}}
}

// join adds a machine to the service's subscribers.
func (d *Discovery) join(m *Machine) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.machines = append(d.machines, m)
	d.mu.Unlock()
}

// publish records a machine's affiliate and refreshes every machine's
// members.
func (d *Discovery) publish(name string, spec cluster.MemberSpec) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.affiliates[name] = spec
	machines := slices.Clone(d.machines)
	d.mu.Unlock()
	for _, m := range machines {
		m.refreshMembers(m.ctx)
	}
}

func (d *Discovery) members() map[string]cluster.MemberSpec {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]cluster.MemberSpec, len(d.affiliates))
	for k, v := range d.affiliates {
		v.Addresses = slices.Clone(v.Addresses)
		out[k] = v
	}
	return out
}

// newNodeID returns a random node identity as Talos makes one: 32 random
// bytes, base62.
func newNodeID() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return new(big.Int).SetBytes(b[:]).Text(62)
}

// discoveryEnabled tells whether the active config enables cluster
// discovery (cluster.discovery.enabled).
func (m *Machine) discoveryEnabled() bool {
	cfg := m.State().Config
	return cfg != nil && cfg.Cluster() != nil && cfg.Cluster().Discovery().Enabled()
}

// publishAffiliate writes the machine's Identity and publishes its
// affiliate, as a boot does.
func (m *Machine) publishAffiliate(ctx context.Context) error {
	if err := safe.StateModify(ctx, m.cosi, cluster.NewIdentity(cluster.NamespaceName, cluster.LocalIdentity), func(r *cluster.Identity) error {
		r.TypedSpec().NodeID = m.nodeID
		return nil
	}); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if !m.discoveryEnabled() {
		return nil
	}
	spec := cluster.MemberSpec{
		NodeID:          m.nodeID,
		Addresses:       []netip.Addr{m.opts.IP},
		Hostname:        m.opts.Name,
		MachineType:     machinetype.TypeWorker,
		OperatingSystem: "Talos (" + m.State().TalosVersion + ")",
	}
	if m.opts.ControlPlane {
		spec.MachineType = machinetype.TypeControlPlane
		spec.ControlPlane = &cluster.ControlPlane{APIServerPort: apiServerPort(m.State().Config)}
	}
	m.opts.Discovery.publish(m.opts.Name, spec)
	return nil
}

// refreshMembers writes the machine's Member resources from the discovery
// service's affiliates (none when its config disables discovery).
func (m *Machine) refreshMembers(ctx context.Context) {
	m.memberMu.Lock()
	defer m.memberMu.Unlock()
	if !m.isUp() {
		return
	}
	want := map[string]cluster.MemberSpec{}
	if m.discoveryEnabled() {
		want = m.opts.Discovery.members()
	}
	for name, spec := range want {
		if err := safe.StateModify(ctx, m.cosi, cluster.NewMember(cluster.NamespaceName, name), func(r *cluster.Member) error {
			*r.TypedSpec() = spec
			return nil
		}); err != nil {
			m.log.Error("member", "member", name, "err", err)
		}
	}
	list, err := safe.StateListAll[*cluster.Member](ctx, m.cosi)
	if err != nil {
		m.log.Error("members", "err", err)
		return
	}
	for r := range list.All() {
		if _, ok := want[r.Metadata().ID()]; !ok {
			if err := m.cosi.Destroy(ctx, r.Metadata()); err != nil && !state.IsNotFoundError(err) {
				m.log.Error("member", "member", r.Metadata().ID(), "err", err)
			}
		}
	}
}
