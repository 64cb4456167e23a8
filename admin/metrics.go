package admin

import (
	"strings"
	"time"

	"fulcrum/backend"
	"fulcrum/status"

	"github.com/prometheus/client_golang/prometheus"
)

// collector turns the snapshot and counters into metrics at scrape time.
type collector struct {
	src Source
	hz  *healthRule // the /healthz rule, for fulcrum_instance_healthy
}

var (
	bLabels = []string{"service", "backend"}

	backendActive   = prometheus.NewDesc("fulcrum_backend_active_connections", "Connections open to the backend now (dials in progress included).", bLabels, nil)
	backendTotal    = prometheus.NewDesc("fulcrum_backend_connections_total", "Connections that took a slot on the backend.", bLabels, nil)
	backendBytes    = prometheus.NewDesc("fulcrum_backend_bytes_total", "Bytes forwarded: direction=\"in\" from clients to the backend, \"out\" from the backend to clients.", append(bLabels, "direction"), nil)
	backendFails    = prometheus.NewDesc("fulcrum_backend_connect_failures_total", "Dials to the backend that failed.", bLabels, nil)
	backendDrained  = prometheus.NewDesc("fulcrum_backend_drain_closed_total", "Connections closed because a drain deadline passed.", bLabels, nil)
	backendUp       = prometheus.NewDesc("fulcrum_backend_up", "1 if the backend takes new connections (up and not draining), else 0.", bLabels, nil)
	backendState    = prometheus.NewDesc("fulcrum_backend_state", "The backend's state: 1 for the state it is in (up, down, wrong_role, draining, maint).", append(bLabels, "state"), nil)
	backendChecks   = prometheus.NewDesc("fulcrum_backend_check_duration_seconds", "How long the backend's active checks took, passed or failed.", bLabels, nil)
	backendResults  = prometheus.NewDesc("fulcrum_backend_checks_total", "Active checks of the backend by result=\"ok\" or \"failed\" (a timeout is a failure).", append(bLabels, "result"), nil)
	backendDrainDL  = prometheus.NewDesc("fulcrum_backend_drain_deadline_timestamp_seconds", "When a draining backend's open sessions are closed; absent when it is not draining or its drain waits for ever.", bLabels, nil)
	backendRole     = prometheus.NewDesc("fulcrum_backend_role", "1 for the role (primary, replica) the backend's role check last observed; absent without one.", append(bLabels, "role"), nil)
	backendCut      = prometheus.NewDesc("fulcrum_backend_sessions_cut_total", "Sessions ended because the backend went down or into the wrong role (on_down = close), or, on a backup, because a primary came up (on_up = close-backups).", bLabels, nil)
	backendWeight   = prometheus.NewDesc("fulcrum_backend_weight", "The backend's effective weight in the current snapshot.", bLabels, nil)
	sLabels         = []string{"service"}
	serviceActive   = prometheus.NewDesc("fulcrum_service_active_connections", "Connections holding a slot of the service.", sLabels, nil)
	serviceWaiting  = prometheus.NewDesc("fulcrum_service_queue_length", "Connections waiting for a free slot now.", sLabels, nil)
	serviceQueued   = prometheus.NewDesc("fulcrum_service_queued_total", "Connections that had to wait for a slot.", sLabels, nil)
	serviceRefused  = prometheus.NewDesc("fulcrum_service_refused_total", "Connections closed for want of a slot: max_conns reached, at once or after queue_timeout.", sLabels, nil)
	serviceRejected = prometheus.NewDesc("fulcrum_service_rejected_total", "Connections turned away before any dial: reason=\"denied\" (allow/deny), \"rate\" (accept_rate), \"per_source\" (max_conns_per_source), \"proxy\" (PROXY header missing, malformed or untrusted).", []string{"service", "reason"}, nil)
	serviceSplit    = prometheus.NewDesc("fulcrum_service_split_brain", "1 while more than one backend of the service claims the primary role.", sLabels, nil)
	serviceSplits   = prometheus.NewDesc("fulcrum_service_split_brains_total", "Times more than one backend of the service began to claim the primary role.", sLabels, nil)
	serviceHolding  = prometheus.NewDesc("fulcrum_service_holding", "Connections waiting for an eligible backend now (hold_timeout).", sLabels, nil)
	serviceHeld     = prometheus.NewDesc("fulcrum_service_held_total", "Connections that waited for an eligible backend (hold_timeout).", sLabels, nil)
	serviceHoldExp  = prometheus.NewDesc("fulcrum_service_hold_expired_total", "Connections closed because no backend became eligible within hold_timeout.", sLabels, nil)
	serviceUnserved = prometheus.NewDesc("fulcrum_service_unserved_total", "Connections fulcrum ended without handing them to any backend, by reason as their access line says: \"no backend\" (nothing eligible, or hold_timeout passed), \"connect failed\" (every dial failed), \"full\" (max_conns).", []string{"service", "reason"}, nil)
	serviceFallback = prometheus.NewDesc("fulcrum_service_fallback", "1 while the service has no eligible backend of its own and new connections go to its fallback service (label fallback).", []string{"service", "fallback"}, nil)
	serviceFBTotal  = prometheus.NewDesc("fulcrum_service_fallbacks_total", "Times the service began to send new connections to its fallback.", sLabels, nil)
	serviceServing  = prometheus.NewDesc("fulcrum_service_serving", "1 for where new connections of the service go now: serving=\"own\" backends, \"fallback\", \"holding\" (hold_timeout) or \"refusing\".", []string{"service", "serving"}, nil)
	backendTrans    = prometheus.NewDesc("fulcrum_backend_transitions_total", "Changes of the backend's health state (up, down, wrong role).", bLabels, nil)
	backendDowntime = prometheus.NewDesc("fulcrum_backend_downtime_seconds_total", "Time the backend spent down or in the wrong role.", bLabels, nil)
	backendSince    = prometheus.NewDesc("fulcrum_backend_state_since_timestamp_seconds", "When the backend entered its current state; absent when up since it was first configured.", bLabels, nil)
	backendLag      = prometheus.NewDesc("fulcrum_backend_replication_lag_seconds", "The replication lag the backend's last check measured (pgsql, a replica); absent when none did.", bLabels, nil)
	serviceRetries  = prometheus.NewDesc("fulcrum_service_retries_total", "Dials tried after a failed one.", sLabels, nil)
	listenAccepts   = prometheus.NewDesc("fulcrum_listener_accepts_total", "Connections accepted on the listen address.", []string{"listen"}, nil)
	listenErrors    = prometheus.NewDesc("fulcrum_listener_accept_errors_total", "Failed accepts (EMFILE, ENFILE…) on the listen address.", []string{"listen"}, nil)
	listenRefused   = prometheus.NewDesc("fulcrum_listener_refused_total", "Connections an address routed by name turned away before any service: reason=\"no-route\" (no route and no default), \"hello-malformed\", \"hello-too-large\", \"preread-timeout\", \"hello-closed\".", []string{"listen", "reason"}, nil)
	connsOpen       = prometheus.NewDesc("fulcrum_connections", "Connections accepted and not ended, on every listener.", nil, nil)
	connsMax        = prometheus.NewDesc("fulcrum_connections_max", "The process's connection limit, derived from RLIMIT_NOFILE: accepting stops there.", nil, nil)
	connsWaits      = prometheus.NewDesc("fulcrum_connection_limit_waits_total", "Times accepting stopped at the connection limit.", nil, nil)
	reloadsTotal    = prometheus.NewDesc("fulcrum_reloads_total", "Configuration reloads applied (the first configuration not counted).", nil, nil)
	reloadsFailed   = prometheus.NewDesc("fulcrum_reload_failures_total", "Configuration reloads refused.", nil, nil)
	generation      = prometheus.NewDesc("fulcrum_config_generation", "Generation of the running configuration: 1 at start, +1 per applied reload.", nil, nil)
	lastReload      = prometheus.NewDesc("fulcrum_config_last_reload_timestamp_seconds", "When the running configuration was applied.", nil, nil)
	lastReloadError = prometheus.NewDesc("fulcrum_config_last_reload_successful", "1 if the last reload attempt was applied, 0 if it was refused.", nil, nil)
	instDraining    = prometheus.NewDesc("fulcrum_instance_draining", "1 while the instance is drained (fulcrum drain, SIGUSR1) or stopping: /healthz fails, connections are still served.", nil, nil)
	instHealthy     = prometheus.NewDesc("fulcrum_instance_healthy", "1 while /healthz answers 200: not draining, some service has a backend up, and new connections are being accepted.", nil, nil)
	logDropped      = prometheus.NewDesc("fulcrum_log_dropped_total", "Log lines dropped because the log's output (stderr) did not take them: a stalled journald or log shipper.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{serviceActive, serviceWaiting, serviceQueued, serviceRefused, serviceRejected, serviceRetries, serviceSplit, serviceSplits, serviceHolding, serviceHeld, serviceHoldExp, serviceUnserved, serviceFallback, serviceFBTotal, serviceServing, backendTrans, backendDowntime, backendSince, backendLag, backendActive, backendTotal, backendBytes, backendFails, backendDrained, backendUp,
		backendState, backendChecks, backendResults, backendDrainDL, backendRole, backendCut, backendWeight, listenAccepts, listenErrors, listenRefused, connsOpen, connsMax, connsWaits, reloadsTotal, reloadsFailed, generation, lastReload, lastReloadError,
		instDraining, instHealthy, logDropped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := Snapshot(c.src)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	for _, s := range st.Services {
		gauge(serviceActive, float64(s.Active), s.Name)
		gauge(serviceWaiting, float64(s.Waiting), s.Name)
		counter(serviceQueued, float64(s.Queued), s.Name)
		counter(serviceRefused, float64(s.Refused), s.Name)
		counter(serviceRetries, float64(s.Retries), s.Name)
		gauge(serviceSplit, boolf(len(s.SplitBrain) > 0), s.Name)
		counter(serviceSplits, float64(s.SplitBrains), s.Name)
		gauge(serviceHolding, float64(s.Holding), s.Name)
		counter(serviceHeld, float64(s.Held), s.Name)
		counter(serviceHoldExp, float64(s.HoldExpired), s.Name)
		for reason, n := range s.Rejected {
			counter(serviceRejected, float64(n), s.Name, reason)
		}
		for reason, n := range s.Unserved {
			counter(serviceUnserved, float64(n), s.Name, reason)
		}
		if s.Serving != "" {
			for _, v := range []string{status.ServingOwn, status.ServingFallback, status.ServingHolding, status.ServingRefusing} {
				gauge(serviceServing, boolf(s.Serving == v), s.Name, v)
			}
			counter(serviceFBTotal, float64(s.Fallbacks), s.Name)
			if s.Fallback != "" {
				gauge(serviceFallback, 1, s.Name, s.Fallback)
			}
		}
		for _, b := range s.Backends {
			l := []string{s.Name, b.Name}
			gauge(backendActive, float64(b.Active), l...)
			counter(backendTotal, float64(b.Total), l...)
			counter(backendBytes, float64(b.BytesIn), s.Name, b.Name, "in")
			counter(backendBytes, float64(b.BytesOut), s.Name, b.Name, "out")
			counter(backendFails, float64(b.ConnectFails), l...)
			counter(backendDrained, float64(b.DrainClosed), l...)
			gauge(backendUp, boolf(b.Up()), l...)
			for _, state := range []string{"up", "down", "wrong role", "draining", "maint"} {
				gauge(backendState, boolf(b.State == state), s.Name, b.Name, strings.ReplaceAll(state, " ", "_"))
			}
			if b.Role != "" {
				for _, role := range []string{"primary", "replica"} {
					gauge(backendRole, boolf(b.Role == role), s.Name, b.Name, role)
				}
			}
			counter(backendCut, float64(b.CutClosed), l...)
			counter(backendTrans, float64(b.Transitions), l...)
			counter(backendDowntime, b.DowntimeSeconds, l...)
			if !b.Since.IsZero() {
				gauge(backendSince, float64(b.Since.UnixNano())/1e9, l...)
			}
			if b.LagSeconds != nil {
				gauge(backendLag, *b.LagSeconds, l...)
			}
			if c := b.Checks; c.Count > 0 {
				buckets := make(map[float64]uint64, len(c.Counts))
				for i, n := range c.Counts {
					buckets[backend.CheckBuckets[i]] = n
				}
				ch <- prometheus.MustNewConstHistogram(backendChecks, c.Count, c.SumSeconds, buckets, l...)
				counter(backendResults, float64(c.OK), s.Name, b.Name, "ok")
				counter(backendResults, float64(c.Failed), s.Name, b.Name, "failed")
			}
			if !b.DrainDeadline.IsZero() {
				gauge(backendDrainDL, float64(b.DrainDeadline.UnixNano())/1e9, l...)
			}
			gauge(backendWeight, float64(b.Weight), l...)
		}
	}
	for _, so := range st.Listeners {
		counter(listenAccepts, float64(so.Accepts), so.Listen)
		counter(listenErrors, float64(so.AcceptErrors), so.Listen)
		for reason, n := range so.Refused {
			counter(listenRefused, float64(n), so.Listen, reason)
		}
	}
	if c := st.Connections; c != nil {
		gauge(connsOpen, float64(c.Open))
		gauge(connsMax, float64(c.Max))
		counter(connsWaits, float64(c.Waits))
	}
	counter(reloadsTotal, float64(st.Reload.Reloads))
	counter(reloadsFailed, float64(st.Reload.Failed))
	gauge(generation, float64(st.Generation))
	if !st.Reload.Applied.IsZero() {
		gauge(lastReload, float64(st.Reload.Applied.UnixNano())/1e9)
	}
	gauge(lastReloadError, boolf(st.Reload.LastError == ""))
	if is := st.Instance; is != nil {
		gauge(instDraining, boolf(is.Draining))
		ok, _ := c.hz.check(time.Now())
		gauge(instHealthy, boolf(ok))
	}
	if c.src.Log != nil {
		n, _ := c.src.Log()
		counter(logDropped, float64(n))
	}
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
