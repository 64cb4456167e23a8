package health

import (
	"context"
	"slices"
	"strings"
)

// watchSentinels starts, under ctx and the controller's checks group, one
// subscription (Probe.WatchSentinel) per Sentinel listed by the
// redis checks of each service and master_name, and returns jobs with Wake
// set: a failover event on any of those Sentinels checks every node of
// that master at once. The caller holds c.mu; jobs is not changed.
func (c *Controller) watchSentinels(ctx context.Context, jobs []Job) []Job {
	type key struct{ service, master, sentinels string }
	wakes := map[key][]chan struct{}{}
	probes := map[key]Probe{}
	var order []key
	jobs = slices.Clone(jobs)
	for i, j := range jobs {
		p := j.Spec.Probe
		if p.Kind != CheckRedis || len(p.Sentinels) == 0 {
			continue
		}
		k := key{j.B.Service, p.MasterName, strings.Join(p.Sentinels, ",")}
		if _, ok := probes[k]; !ok {
			probes[k] = p
			order = append(order, k)
		}
		w := make(chan struct{}, 1)
		wakes[k] = append(wakes[k], w)
		jobs[i].Spec.Wake = w
	}
	for _, k := range order {
		p, ws := probes[k], wakes[k]
		log := c.log.With().Str("service", k.service).Str("master_name", k.master).Logger()
		for _, s := range p.Sentinels {
			c.checks.Add(1)
			go func() { // exits when the next SetChecks or Stop cancels ctx
				defer c.checks.Done()
				up := true // log the first loss of a run of failures, not each retry
				p.WatchSentinel(ctx, s, func(event, payload string) {
					if event == "subscribed" {
						if !up {
							log.Info().Str("sentinel", s).Msg("sentinel events: subscribed again")
						}
						up = true
					} else {
						log.Info().Str("sentinel", s).Str("event", event).Str("payload", payload).Msg("sentinel event: checking now")
					}
					for _, w := range ws {
						select {
						case w <- struct{}{}:
						default: // a check is already due
						}
					}
				}, func(err error) {
					if up {
						log.Warn().Str("sentinel", s).Err(err).Msg("sentinel events: subscription lost, retrying; the checks go on at their interval")
					}
					up = false
				})
			}()
		}
	}
	return jobs
}
