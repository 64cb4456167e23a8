package reload

import (
	"fulcrum/conf"
	"fulcrum/health"
)

// speaksPostgres reports whether service cs speaks PostgreSQL: protocol =
// "postgres", or "auto" (the default) and one of its backends checks with
// pgsql. The listener then looks for cancel requests on its addresses not
// routed by name (docs/databases.md, "Cancel requests").
func speaksPostgres(cs conf.Service) bool {
	switch cs.Protocol {
	case conf.ProtocolPostgres:
		return true
	case conf.ProtocolTCP:
		return false
	}
	for _, b := range cs.Backends {
		if b.Health.Check == health.CheckPgSQL {
			return true
		}
	}
	return false
}
