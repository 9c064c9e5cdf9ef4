package machine

// The etcd member of a control plane, as far as Talos' etcd calls show it.
// No etcd runs per machine here (one real etcd serves the simulated
// cluster's API server); each control plane answers for a member of a
// healthy cluster unless a fault says otherwise: etcdStopped (the member's
// etcd is stopped but stays listed by the others) or etcdAlarm (the member
// raised an alarm, which every member then reports).

// EtcdStopped tells whether the machine's etcd member is stopped (a fault).
func (m *Machine) EtcdStopped() bool { return m.faults().EtcdStopped }

// EtcdAlarm is the alarm the machine's etcd member raised, "" for none (a
// fault: NOSPACE or CORRUPT).
func (m *Machine) EtcdAlarm() string { return m.faults().EtcdAlarm }
