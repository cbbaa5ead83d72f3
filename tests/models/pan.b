	switch (t->back) {
	default: Uerror("bad return move");
	case  0: goto R999; /* nothing to undo */

		 /* PROC :init: */

	case 3: // STATE 1
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 4: // STATE 2
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 5: // STATE 3
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 6: // STATE 4
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 7: // STATE 5
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 8: // STATE 6
		;
		;
		delproc(0, now._nr_pr-1);
		;
		goto R999;

	case 9: // STATE 8
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC Survivor */

	case 10: // STATE 3
		;
		((P5 *)_this)->since = trpt->bup.ovals[2];
		((P5 *)_this)->seen = trpt->bup.ovals[1];
	/* 0 */	((P5 *)_this)->seen = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 3);
		goto R999;
;
		
	case 11: // STATE 5
		goto R999;

	case 12: // STATE 11
		;
		_m = unsend(now.sb_s);
		;
		goto R999;
;
		;
		
	case 14: // STATE 15
		;
		((P5 *)_this)->since = trpt->bup.ovals[2];
		((P5 *)_this)->seen = trpt->bup.ovals[1];
	/* 0 */	((P5 *)_this)->seen = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 3);
		goto R999;

	case 15: // STATE 17
		;
	/* 1 */	((P5 *)_this)->since = trpt->bup.ovals[1];
	/* 0 */	((P5 *)_this)->seen = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 16: // STATE 23
		;
		now.recovering = trpt->bup.oval;
		;
		goto R999;

	case 17: // STATE 24
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC Writer */

	case 18: // STATE 1
		;
		((P4 *)_this)->n = trpt->bup.oval;
		;
		goto R999;
;
		;
		
	case 20: // STATE 5
		;
		now.in_window = trpt->bup.ovals[1];
		now.check_time = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;
;
		
	case 21: // STATE 9
		goto R999;
;
		
	case 22: // STATE 7
		goto R999;
;
		;
		
	case 24: // STATE 13
		;
		now.mtx = trpt->bup.oval;
		;
		goto R999;
;
		;
		;
		;
		
	case 27: // STATE 21
		;
		now.hbeat = trpt->bup.ovals[1];
		((P4 *)_this)->t0 = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 28: // STATE 24
		;
		now.in_window = trpt->bup.ovals[1];
		now.check_time = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;
;
		
	case 29: // STATE 28
		goto R999;
;
		
	case 30: // STATE 26
		goto R999;

	case 31: // STATE 29
		;
		_m = unsend(now.sb_h);
		;
		goto R999;
;
		;
		
	case 33: // STATE 45
		;
		((P4 *)_this)->t0 = trpt->bup.ovals[3];
		now.in_window = trpt->bup.ovals[2];
		now.valid_until = trpt->bup.ovals[1];
		now.fenced = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 4);
		goto R999;

	case 34: // STATE 45
		;
		((P4 *)_this)->t0 = trpt->bup.oval;
		;
		goto R999;

	case 35: // STATE 45
		;
		((P4 *)_this)->t0 = trpt->bup.ovals[1];
		now.valid_until = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 36: // STATE 45
		;
		((P4 *)_this)->t0 = trpt->bup.oval;
		;
		goto R999;

	case 37: // STATE 50
		;
		now.mtx = trpt->bup.oval;
		;
		goto R999;
;
		;
		
	case 39: // STATE 65
		;
		((P4 *)_this)->n = trpt->bup.ovals[2];
		now.check_time = trpt->bup.ovals[1];
		now.in_window = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 3);
		goto R999;

	case 40: // STATE 71
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC Heartbeat */

	case 41: // STATE 2
		;
		now.mtx = trpt->bup.oval;
		;
		goto R999;
;
		;
		
	case 43: // STATE 5
		;
		now.mtx = trpt->bup.oval;
		;
		goto R999;
;
		;
		
	case 45: // STATE 11
		;
		now.hbeat = trpt->bup.ovals[1];
		((P3 *)_this)->t0 = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 46: // STATE 14
		;
		now.in_window = trpt->bup.ovals[1];
		now.check_time = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;
;
		
	case 47: // STATE 18
		goto R999;
;
		
	case 48: // STATE 16
		goto R999;

	case 49: // STATE 19
		;
		_m = unsend(now.sb_h);
		;
		goto R999;
;
		;
		
	case 51: // STATE 35
		;
		((P3 *)_this)->t0 = trpt->bup.ovals[3];
		now.in_window = trpt->bup.ovals[2];
		now.valid_until = trpt->bup.ovals[1];
		now.fenced = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 4);
		goto R999;

	case 52: // STATE 35
		;
		((P3 *)_this)->t0 = trpt->bup.oval;
		;
		goto R999;

	case 53: // STATE 35
		;
		((P3 *)_this)->t0 = trpt->bup.ovals[1];
		now.valid_until = trpt->bup.ovals[0];
		;
		ungrab_ints(trpt->bup.ovals, 2);
		goto R999;

	case 54: // STATE 35
		;
		((P3 *)_this)->t0 = trpt->bup.oval;
		;
		goto R999;

	case 55: // STATE 38
		;
		now.mtx = trpt->bup.oval;
		;
		goto R999;

	case 56: // STATE 44
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC DrainS */

	case 57: // STATE 3
		;
		((P2 *)_this)->v = trpt->bup.ovals[2];
		now.epoch_mem = trpt->bup.ovals[1];
		XX = 1;
		unrecv(now.sb_s, XX-1, 0, ((int)((P2 *)_this)->v), 1);
		((P2 *)_this)->v = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 3);
		goto R999;

	case 58: // STATE 8
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC DrainH */

	case 59: // STATE 3
		;
		((P1 *)_this)->v = trpt->bup.ovals[2];
		now.beat_mem = trpt->bup.ovals[1];
		XX = 1;
		unrecv(now.sb_h, XX-1, 0, ((int)((P1 *)_this)->v), 1);
		((P1 *)_this)->v = trpt->bup.ovals[0];
		;
		;
		ungrab_ints(trpt->bup.ovals, 3);
		goto R999;

	case 60: // STATE 8
		;
		p_restor(II);
		;
		;
		goto R999;

		 /* PROC Clock */

	case 61: // STATE 2
		;
		now.now = trpt->bup.oval;
		;
		goto R999;

	case 62: // STATE 7
		;
		p_restor(II);
		;
		;
		goto R999;
	}

