#define rand	pan_rand
#define pthread_equal(a,b)	((a)==(b))
#if defined(HAS_CODE) && defined(VERBOSE)
	#ifdef BFS_PAR
		bfs_printf("Pr: %d Tr: %d\n", II, t->forw);
	#else
		cpu_printf("Pr: %d Tr: %d\n", II, t->forw);
	#endif
#endif
	switch (t->forw) {
	default: Uerror("bad forward move");
	case 0:	/* if without executable clauses */
		continue;
	case 1: /* generic 'goto' or 'skip' */
		IfNotBlocked
		_m = 3; goto P999;
	case 2: /* generic 'else' */
		IfNotBlocked
		if (trpt->o_pm&1) continue;
		_m = 3; goto P999;

		 /* PROC :init: */
	case 3: // STATE 1 - lease_fence_tso.pml:204 - [(run Clock())] (0:0:0 - 1)
		IfNotBlocked
		reached[6][1] = 1;
		if (!(addproc(II, 1, 0)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 4: // STATE 2 - lease_fence_tso.pml:204 - [(run DrainH())] (0:0:0 - 1)
		IfNotBlocked
		reached[6][2] = 1;
		if (!(addproc(II, 1, 1)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 5: // STATE 3 - lease_fence_tso.pml:204 - [(run DrainS())] (0:0:0 - 1)
		IfNotBlocked
		reached[6][3] = 1;
		if (!(addproc(II, 1, 2)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 6: // STATE 4 - lease_fence_tso.pml:205 - [(run Heartbeat())] (0:0:0 - 1)
		IfNotBlocked
		reached[6][4] = 1;
		if (!(addproc(II, 1, 3)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 7: // STATE 5 - lease_fence_tso.pml:205 - [(run Writer())] (0:0:0 - 1)
		IfNotBlocked
		reached[6][5] = 1;
		if (!(addproc(II, 1, 4)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 8: // STATE 6 - lease_fence_tso.pml:205 - [(run Survivor())] (0:0:0 - 1)
		IfNotBlocked
		reached[6][6] = 1;
		if (!(addproc(II, 1, 5)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 9: // STATE 8 - lease_fence_tso.pml:207 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[6][8] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC Survivor */
	case 10: // STATE 1 - lease_fence_tso.pml:185 - [((beat_mem!=seen))] (8:0:3 - 1)
		IfNotBlocked
		reached[5][1] = 1;
		if (!((((int)now.beat_mem)!=((int)((P5 *)_this)->seen))))
			continue;
		if (TstOnly) return 1; /* TT */
		/* dead 1: seen */  (trpt+1)->bup.ovals = grab_ints(3);
		(trpt+1)->bup.ovals[0] = ((P5 *)_this)->seen;
#ifdef HAS_CODE
		if (!readtrail)
#endif
			((P5 *)_this)->seen = 0;
		/* merge: seen = beat_mem(8, 2, 8) */
		reached[5][2] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P5 *)_this)->seen);
		((P5 *)_this)->seen = ((int)now.beat_mem);
#ifdef VAR_RANGES
		logval("Survivor:seen", ((int)((P5 *)_this)->seen));
#endif
		;
		/* merge: since = now(8, 3, 8) */
		reached[5][3] = 1;
		(trpt+1)->bup.ovals[2] = ((int)((P5 *)_this)->since);
		((P5 *)_this)->since = ((int)now.now);
#ifdef VAR_RANGES
		logval("Survivor:since", ((int)((P5 *)_this)->since));
#endif
		;
		/* merge: .(goto)(0, 9, 8) */
		reached[5][9] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 11: // STATE 5 - lease_fence_tso.pml:186 - [(((beat_mem==seen)&&((now-since)>(3+1))))] (11:0:0 - 1)
		IfNotBlocked
		reached[5][5] = 1;
		if (!(((((int)now.beat_mem)==((int)((P5 *)_this)->seen))&&((((int)now.now)-((int)((P5 *)_this)->since))>(3+1)))))
			continue;
		/* merge: goto :b5(0, 6, 11) */
		reached[5][6] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 12: // STATE 11 - lease_fence_tso.pml:189 - [sb_s!1] (0:0:0 - 2)
		IfNotBlocked
		reached[5][11] = 1;
		if (q_full(now.sb_s))
			continue;
#ifdef HAS_CODE
		if (readtrail && gui) {
			char simtmp[64];
			sprintf(simvals, "%d!", now.sb_s);
		sprintf(simtmp, "%d", 1); strcat(simvals, simtmp);		}
#endif
		
		qsend(now.sb_s, 0, 1, 1);
		_m = 2; goto P999; /* 0 */
	case 13: // STATE 12 - lease_fence_tso.pml:191 - [((len(sb_s)==0))] (0:0:0 - 1)
		IfNotBlocked
		reached[5][12] = 1;
		if (!((q_len(now.sb_s)==0)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 14: // STATE 13 - lease_fence_tso.pml:195 - [((beat_mem!=seen))] (20:0:3 - 1)
		IfNotBlocked
		reached[5][13] = 1;
		if (!((((int)now.beat_mem)!=((int)((P5 *)_this)->seen))))
			continue;
		if (TstOnly) return 1; /* TT */
		/* dead 1: seen */  (trpt+1)->bup.ovals = grab_ints(3);
		(trpt+1)->bup.ovals[0] = ((P5 *)_this)->seen;
#ifdef HAS_CODE
		if (!readtrail)
#endif
			((P5 *)_this)->seen = 0;
		/* merge: seen = beat_mem(20, 14, 20) */
		reached[5][14] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P5 *)_this)->seen);
		((P5 *)_this)->seen = ((int)now.beat_mem);
#ifdef VAR_RANGES
		logval("Survivor:seen", ((int)((P5 *)_this)->seen));
#endif
		;
		/* merge: since = now(20, 15, 20) */
		reached[5][15] = 1;
		(trpt+1)->bup.ovals[2] = ((int)((P5 *)_this)->since);
		((P5 *)_this)->since = ((int)now.now);
#ifdef VAR_RANGES
		logval("Survivor:since", ((int)((P5 *)_this)->since));
#endif
		;
		/* merge: .(goto)(0, 21, 20) */
		reached[5][21] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 15: // STATE 17 - lease_fence_tso.pml:196 - [(((beat_mem==seen)&&((now-since)>(3+1))))] (23:0:2 - 1)
		IfNotBlocked
		reached[5][17] = 1;
		if (!(((((int)now.beat_mem)==((int)((P5 *)_this)->seen))&&((((int)now.now)-((int)((P5 *)_this)->since))>(3+1)))))
			continue;
		if (TstOnly) return 1; /* TT */
		/* dead 1: seen */  (trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((P5 *)_this)->seen;
#ifdef HAS_CODE
		if (!readtrail)
#endif
			((P5 *)_this)->seen = 0;
		if (TstOnly) return 1; /* TT */
		/* dead 1: since */  (trpt+1)->bup.ovals[1] = ((P5 *)_this)->since;
#ifdef HAS_CODE
		if (!readtrail)
#endif
			((P5 *)_this)->since = 0;
		/* merge: goto :b6(0, 18, 23) */
		reached[5][18] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 16: // STATE 23 - lease_fence_tso.pml:199 - [recovering = 1] (0:0:1 - 2)
		IfNotBlocked
		reached[5][23] = 1;
		(trpt+1)->bup.oval = ((int)now.recovering);
		now.recovering = 1;
#ifdef VAR_RANGES
		logval("recovering", ((int)now.recovering));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 17: // STATE 24 - lease_fence_tso.pml:200 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[5][24] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC Writer */
	case 18: // STATE 1 - lease_fence_tso.pml:149 - [n = 1] (0:0:1 - 1)
		IfNotBlocked
		reached[4][1] = 1;
		(trpt+1)->bup.oval = ((int)((P4 *)_this)->n);
		((P4 *)_this)->n = 1;
#ifdef VAR_RANGES
		logval("Writer:n", ((int)((P4 *)_this)->n));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 19: // STATE 2 - lease_fence_tso.pml:149 - [((n<=2))] (0:0:0 - 1)
		IfNotBlocked
		reached[4][2] = 1;
		if (!((((int)((P4 *)_this)->n)<=2)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 20: // STATE 3 - lease_fence_tso.pml:157 - [((now<valid_until))] (53:0:2 - 1)
		IfNotBlocked
		reached[4][3] = 1;
		if (!((((int)now.now)<((int)now.valid_until))))
			continue;
		/* merge: check_time = now(53, 4, 53) */
		reached[4][4] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.check_time);
		now.check_time = ((int)now.now);
#ifdef VAR_RANGES
		logval("check_time", ((int)now.check_time));
#endif
		;
		/* merge: in_window = 1(53, 5, 53) */
		reached[4][5] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.in_window);
		now.in_window = 1;
#ifdef VAR_RANGES
		logval("in_window", ((int)now.in_window));
#endif
		;
		/* merge: .(goto)(53, 9, 53) */
		reached[4][9] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 21: // STATE 9 - lease_fence_tso.pml:160 - [.(goto)] (0:53:0 - 2)
		IfNotBlocked
		reached[4][9] = 1;
		;
		_m = 3; goto P999; /* 0 */
	case 22: // STATE 7 - lease_fence_tso.pml:158 - [(1)] (53:0:0 - 1)
		IfNotBlocked
		reached[4][7] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(53, 9, 53) */
		reached[4][9] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 23: // STATE 11 - lease_fence_tso.pml:162 - [(!(in_window))] (0:0:0 - 1)
		IfNotBlocked
		reached[4][11] = 1;
		if (!( !(((int)now.in_window))))
			continue;
		_m = 3; goto P999; /* 0 */
	case 24: // STATE 12 - lease_fence_tso.pml:163 - [(!(mtx))] (48:0:1 - 1)
		IfNotBlocked
		reached[4][12] = 1;
		if (!( !(((int)now.mtx))))
			continue;
		/* merge: mtx = 1(0, 13, 48) */
		reached[4][13] = 1;
		(trpt+1)->bup.oval = ((int)now.mtx);
		now.mtx = 1;
#ifdef VAR_RANGES
		logval("mtx", ((int)now.mtx));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 25: // STATE 15 - lease_fence_tso.pml:165 - [(fenced)] (0:0:0 - 1)
		IfNotBlocked
		reached[4][15] = 1;
		if (!(((int)now.fenced)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 26: // STATE 18 - lease_fence_tso.pml:119 - [((hbeat<3))] (0:0:0 - 1)
		IfNotBlocked
		reached[4][18] = 1;
		if (!((((int)now.hbeat)<3)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 27: // STATE 20 - lease_fence_tso.pml:122 - [t0 = now] (0:27:2 - 1)
		IfNotBlocked
		reached[4][20] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)((P4 *)_this)->t0);
		((P4 *)_this)->t0 = ((int)now.now);
#ifdef VAR_RANGES
		logval("Writer:t0", ((int)((P4 *)_this)->t0));
#endif
		;
		/* merge: hbeat = (hbeat+1)(27, 21, 27) */
		reached[4][21] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.hbeat);
		now.hbeat = (((int)now.hbeat)+1);
#ifdef VAR_RANGES
		logval("hbeat", ((int)now.hbeat));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 28: // STATE 22 - lease_fence_tso.pml:123 - [(1)] (29:0:2 - 1)
		IfNotBlocked
		reached[4][22] = 1;
		if (!(1))
			continue;
		/* merge: check_time = t0(29, 23, 29) */
		reached[4][23] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.check_time);
		now.check_time = ((int)((P4 *)_this)->t0);
#ifdef VAR_RANGES
		logval("check_time", ((int)now.check_time));
#endif
		;
		/* merge: in_window = 1(29, 24, 29) */
		reached[4][24] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.in_window);
		now.in_window = 1;
#ifdef VAR_RANGES
		logval("in_window", ((int)now.in_window));
#endif
		;
		/* merge: .(goto)(29, 28, 29) */
		reached[4][28] = 1;
		;
		_m = 3; goto P999; /* 3 */
	case 29: // STATE 28 - lease_fence_tso.pml:124 - [.(goto)] (0:29:0 - 2)
		IfNotBlocked
		reached[4][28] = 1;
		;
		_m = 3; goto P999; /* 0 */
	case 30: // STATE 26 - lease_fence_tso.pml:123 - [(1)] (29:0:0 - 1)
		IfNotBlocked
		reached[4][26] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(29, 28, 29) */
		reached[4][28] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 31: // STATE 29 - lease_fence_tso.pml:124 - [sb_h!hbeat] (0:0:0 - 1)
		IfNotBlocked
		reached[4][29] = 1;
		if (q_full(now.sb_h))
			continue;
#ifdef HAS_CODE
		if (readtrail && gui) {
			char simtmp[64];
			sprintf(simvals, "%d!", now.sb_h);
		sprintf(simtmp, "%d", ((int)now.hbeat)); strcat(simvals, simtmp);		}
#endif
		
		qsend(now.sb_h, 0, ((int)now.hbeat), 1);
		_m = 2; goto P999; /* 0 */
	case 32: // STATE 31 - lease_fence_tso.pml:126 - [((len(sb_h)==0))] (0:0:0 - 1)
		IfNotBlocked
		reached[4][31] = 1;
		if (!((q_len(now.sb_h)==0)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 33: // STATE 32 - lease_fence_tso.pml:129 - [((epoch_mem!=0))] (50:0:4 - 1)
		IfNotBlocked
		reached[4][32] = 1;
		if (!((((int)now.epoch_mem)!=0)))
			continue;
		/* merge: fenced = 1(50, 33, 50) */
		reached[4][33] = 1;
		(trpt+1)->bup.ovals = grab_ints(4);
		(trpt+1)->bup.ovals[0] = ((int)now.fenced);
		now.fenced = 1;
#ifdef VAR_RANGES
		logval("fenced", ((int)now.fenced));
#endif
		;
		/* merge: valid_until = 0(50, 34, 50) */
		reached[4][34] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.valid_until);
		now.valid_until = 0;
#ifdef VAR_RANGES
		logval("valid_until", ((int)now.valid_until));
#endif
		;
		/* merge: in_window = 0(50, 35, 50) */
		reached[4][35] = 1;
		(trpt+1)->bup.ovals[2] = ((int)now.in_window);
		now.in_window = 0;
#ifdef VAR_RANGES
		logval("in_window", ((int)now.in_window));
#endif
		;
		/* merge: .(goto)(50, 44, 50) */
		reached[4][44] = 1;
		;
		/* merge: t0 = 0(50, 45, 50) */
		reached[4][45] = 1;
		(trpt+1)->bup.ovals[3] = ((int)((P4 *)_this)->t0);
		((P4 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Writer:t0", ((int)((P4 *)_this)->t0));
#endif
		;
		/* merge: .(goto)(0, 49, 50) */
		reached[4][49] = 1;
		;
		_m = 3; goto P999; /* 6 */
	case 34: // STATE 44 - lease_fence_tso.pml:132 - [.(goto)] (0:50:1 - 4)
		IfNotBlocked
		reached[4][44] = 1;
		;
		/* merge: t0 = 0(50, 45, 50) */
		reached[4][45] = 1;
		(trpt+1)->bup.oval = ((int)((P4 *)_this)->t0);
		((P4 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Writer:t0", ((int)((P4 *)_this)->t0));
#endif
		;
		/* merge: .(goto)(0, 49, 50) */
		reached[4][49] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 35: // STATE 37 - lease_fence_tso.pml:130 - [(((t0+(3-1))>valid_until))] (50:0:2 - 1)
		IfNotBlocked
		reached[4][37] = 1;
		if (!(((((int)((P4 *)_this)->t0)+(3-1))>((int)now.valid_until))))
			continue;
		/* merge: valid_until = (t0+(3-1))(50, 38, 50) */
		reached[4][38] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.valid_until);
		now.valid_until = (((int)((P4 *)_this)->t0)+(3-1));
#ifdef VAR_RANGES
		logval("valid_until", ((int)now.valid_until));
#endif
		;
		/* merge: .(goto)(50, 42, 50) */
		reached[4][42] = 1;
		;
		/* merge: .(goto)(50, 44, 50) */
		reached[4][44] = 1;
		;
		/* merge: t0 = 0(50, 45, 50) */
		reached[4][45] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P4 *)_this)->t0);
		((P4 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Writer:t0", ((int)((P4 *)_this)->t0));
#endif
		;
		/* merge: .(goto)(0, 49, 50) */
		reached[4][49] = 1;
		;
		_m = 3; goto P999; /* 5 */
	case 36: // STATE 40 - lease_fence_tso.pml:130 - [(1)] (50:0:1 - 1)
		IfNotBlocked
		reached[4][40] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(50, 42, 50) */
		reached[4][42] = 1;
		;
		/* merge: .(goto)(50, 44, 50) */
		reached[4][44] = 1;
		;
		/* merge: t0 = 0(50, 45, 50) */
		reached[4][45] = 1;
		(trpt+1)->bup.oval = ((int)((P4 *)_this)->t0);
		((P4 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Writer:t0", ((int)((P4 *)_this)->t0));
#endif
		;
		/* merge: .(goto)(0, 49, 50) */
		reached[4][49] = 1;
		;
		_m = 3; goto P999; /* 4 */
	case 37: // STATE 50 - lease_fence_tso.pml:168 - [mtx = 0] (0:0:1 - 3)
		IfNotBlocked
		reached[4][50] = 1;
		(trpt+1)->bup.oval = ((int)now.mtx);
		now.mtx = 0;
#ifdef VAR_RANGES
		logval("mtx", ((int)now.mtx));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 38: // STATE 55 - lease_fence_tso.pml:172 - [(!(in_window))] (0:0:0 - 1)
		IfNotBlocked
		reached[4][55] = 1;
		if (!( !(((int)now.in_window))))
			continue;
		_m = 3; goto P999; /* 0 */
	case 39: // STATE 61 - lease_fence_tso.pml:176 - [assert(!(recovering))] (0:68:3 - 1)
		IfNotBlocked
		reached[4][61] = 1;
		spin_assert( !(((int)now.recovering)), " !(recovering)", II, tt, t);
		/* merge: in_window = 0(68, 62, 68) */
		reached[4][62] = 1;
		(trpt+1)->bup.ovals = grab_ints(3);
		(trpt+1)->bup.ovals[0] = ((int)now.in_window);
		now.in_window = 0;
#ifdef VAR_RANGES
		logval("in_window", ((int)now.in_window));
#endif
		;
		/* merge: check_time = 0(68, 63, 68) */
		reached[4][63] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.check_time);
		now.check_time = 0;
#ifdef VAR_RANGES
		logval("check_time", ((int)now.check_time));
#endif
		;
		/* merge: n = (n+1)(68, 65, 68) */
		reached[4][65] = 1;
		(trpt+1)->bup.ovals[2] = ((int)((P4 *)_this)->n);
		((P4 *)_this)->n = (((int)((P4 *)_this)->n)+1);
#ifdef VAR_RANGES
		logval("Writer:n", ((int)((P4 *)_this)->n));
#endif
		;
		/* merge: .(goto)(0, 69, 68) */
		reached[4][69] = 1;
		;
		_m = 3; goto P999; /* 4 */
	case 40: // STATE 71 - lease_fence_tso.pml:178 - [-end-] (0:0:0 - 5)
		IfNotBlocked
		reached[4][71] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC Heartbeat */
	case 41: // STATE 1 - lease_fence_tso.pml:139 - [(!(mtx))] (39:0:1 - 1)
		IfNotBlocked
		reached[3][1] = 1;
		if (!( !(((int)now.mtx))))
			continue;
		/* merge: mtx = 1(0, 2, 39) */
		reached[3][2] = 1;
		(trpt+1)->bup.oval = ((int)now.mtx);
		now.mtx = 1;
#ifdef VAR_RANGES
		logval("mtx", ((int)now.mtx));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 42: // STATE 4 - lease_fence_tso.pml:141 - [(fenced)] (0:0:0 - 1)
		IfNotBlocked
		reached[3][4] = 1;
		if (!(((int)now.fenced)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 43: // STATE 5 - lease_fence_tso.pml:141 - [mtx = 0] (0:0:1 - 1)
		IfNotBlocked
		reached[3][5] = 1;
		(trpt+1)->bup.oval = ((int)now.mtx);
		now.mtx = 0;
#ifdef VAR_RANGES
		logval("mtx", ((int)now.mtx));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 44: // STATE 8 - lease_fence_tso.pml:119 - [((hbeat<3))] (0:0:0 - 1)
		IfNotBlocked
		reached[3][8] = 1;
		if (!((((int)now.hbeat)<3)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 45: // STATE 10 - lease_fence_tso.pml:122 - [t0 = now] (0:17:2 - 1)
		IfNotBlocked
		reached[3][10] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)((P3 *)_this)->t0);
		((P3 *)_this)->t0 = ((int)now.now);
#ifdef VAR_RANGES
		logval("Heartbeat:t0", ((int)((P3 *)_this)->t0));
#endif
		;
		/* merge: hbeat = (hbeat+1)(17, 11, 17) */
		reached[3][11] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.hbeat);
		now.hbeat = (((int)now.hbeat)+1);
#ifdef VAR_RANGES
		logval("hbeat", ((int)now.hbeat));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 46: // STATE 13 - lease_fence_tso.pml:123 - [check_time = t0] (0:19:2 - 1)
		IfNotBlocked
		reached[3][13] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.check_time);
		now.check_time = ((int)((P3 *)_this)->t0);
#ifdef VAR_RANGES
		logval("check_time", ((int)now.check_time));
#endif
		;
		/* merge: in_window = 1(19, 14, 19) */
		reached[3][14] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.in_window);
		now.in_window = 1;
#ifdef VAR_RANGES
		logval("in_window", ((int)now.in_window));
#endif
		;
		/* merge: .(goto)(19, 18, 19) */
		reached[3][18] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 47: // STATE 18 - lease_fence_tso.pml:124 - [.(goto)] (0:19:0 - 2)
		IfNotBlocked
		reached[3][18] = 1;
		;
		_m = 3; goto P999; /* 0 */
	case 48: // STATE 16 - lease_fence_tso.pml:123 - [(1)] (19:0:0 - 1)
		IfNotBlocked
		reached[3][16] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(19, 18, 19) */
		reached[3][18] = 1;
		;
		_m = 3; goto P999; /* 1 */
	case 49: // STATE 19 - lease_fence_tso.pml:124 - [sb_h!hbeat] (0:0:0 - 1)
		IfNotBlocked
		reached[3][19] = 1;
		if (q_full(now.sb_h))
			continue;
#ifdef HAS_CODE
		if (readtrail && gui) {
			char simtmp[64];
			sprintf(simvals, "%d!", now.sb_h);
		sprintf(simtmp, "%d", ((int)now.hbeat)); strcat(simvals, simtmp);		}
#endif
		
		qsend(now.sb_h, 0, ((int)now.hbeat), 1);
		_m = 2; goto P999; /* 0 */
	case 50: // STATE 21 - lease_fence_tso.pml:126 - [((len(sb_h)==0))] (0:0:0 - 1)
		IfNotBlocked
		reached[3][21] = 1;
		if (!((q_len(now.sb_h)==0)))
			continue;
		_m = 3; goto P999; /* 0 */
	case 51: // STATE 22 - lease_fence_tso.pml:129 - [((epoch_mem!=0))] (38:0:4 - 1)
		IfNotBlocked
		reached[3][22] = 1;
		if (!((((int)now.epoch_mem)!=0)))
			continue;
		/* merge: fenced = 1(38, 23, 38) */
		reached[3][23] = 1;
		(trpt+1)->bup.ovals = grab_ints(4);
		(trpt+1)->bup.ovals[0] = ((int)now.fenced);
		now.fenced = 1;
#ifdef VAR_RANGES
		logval("fenced", ((int)now.fenced));
#endif
		;
		/* merge: valid_until = 0(38, 24, 38) */
		reached[3][24] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.valid_until);
		now.valid_until = 0;
#ifdef VAR_RANGES
		logval("valid_until", ((int)now.valid_until));
#endif
		;
		/* merge: in_window = 0(38, 25, 38) */
		reached[3][25] = 1;
		(trpt+1)->bup.ovals[2] = ((int)now.in_window);
		now.in_window = 0;
#ifdef VAR_RANGES
		logval("in_window", ((int)now.in_window));
#endif
		;
		/* merge: .(goto)(38, 34, 38) */
		reached[3][34] = 1;
		;
		/* merge: t0 = 0(38, 35, 38) */
		reached[3][35] = 1;
		(trpt+1)->bup.ovals[3] = ((int)((P3 *)_this)->t0);
		((P3 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Heartbeat:t0", ((int)((P3 *)_this)->t0));
#endif
		;
		_m = 3; goto P999; /* 5 */
	case 52: // STATE 34 - lease_fence_tso.pml:132 - [.(goto)] (0:38:1 - 4)
		IfNotBlocked
		reached[3][34] = 1;
		;
		/* merge: t0 = 0(38, 35, 38) */
		reached[3][35] = 1;
		(trpt+1)->bup.oval = ((int)((P3 *)_this)->t0);
		((P3 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Heartbeat:t0", ((int)((P3 *)_this)->t0));
#endif
		;
		_m = 3; goto P999; /* 1 */
	case 53: // STATE 27 - lease_fence_tso.pml:130 - [(((t0+(3-1))>valid_until))] (38:0:2 - 1)
		IfNotBlocked
		reached[3][27] = 1;
		if (!(((((int)((P3 *)_this)->t0)+(3-1))>((int)now.valid_until))))
			continue;
		/* merge: valid_until = (t0+(3-1))(38, 28, 38) */
		reached[3][28] = 1;
		(trpt+1)->bup.ovals = grab_ints(2);
		(trpt+1)->bup.ovals[0] = ((int)now.valid_until);
		now.valid_until = (((int)((P3 *)_this)->t0)+(3-1));
#ifdef VAR_RANGES
		logval("valid_until", ((int)now.valid_until));
#endif
		;
		/* merge: .(goto)(38, 32, 38) */
		reached[3][32] = 1;
		;
		/* merge: .(goto)(38, 34, 38) */
		reached[3][34] = 1;
		;
		/* merge: t0 = 0(38, 35, 38) */
		reached[3][35] = 1;
		(trpt+1)->bup.ovals[1] = ((int)((P3 *)_this)->t0);
		((P3 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Heartbeat:t0", ((int)((P3 *)_this)->t0));
#endif
		;
		_m = 3; goto P999; /* 4 */
	case 54: // STATE 30 - lease_fence_tso.pml:130 - [(1)] (38:0:1 - 1)
		IfNotBlocked
		reached[3][30] = 1;
		if (!(1))
			continue;
		/* merge: .(goto)(38, 32, 38) */
		reached[3][32] = 1;
		;
		/* merge: .(goto)(38, 34, 38) */
		reached[3][34] = 1;
		;
		/* merge: t0 = 0(38, 35, 38) */
		reached[3][35] = 1;
		(trpt+1)->bup.oval = ((int)((P3 *)_this)->t0);
		((P3 *)_this)->t0 = 0;
#ifdef VAR_RANGES
		logval("Heartbeat:t0", ((int)((P3 *)_this)->t0));
#endif
		;
		_m = 3; goto P999; /* 3 */
	case 55: // STATE 38 - lease_fence_tso.pml:142 - [mtx = 0] (0:0:1 - 1)
		IfNotBlocked
		reached[3][38] = 1;
		(trpt+1)->bup.oval = ((int)now.mtx);
		now.mtx = 0;
#ifdef VAR_RANGES
		logval("mtx", ((int)now.mtx));
#endif
		;
		_m = 3; goto P999; /* 0 */
	case 56: // STATE 44 - lease_fence_tso.pml:145 - [-end-] (0:0:0 - 3)
		IfNotBlocked
		reached[3][44] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC DrainS */
	case 57: // STATE 1 - lease_fence_tso.pml:112 - [sb_s?v] (5:0:3 - 1)
		reached[2][1] = 1;
		if (q_len(now.sb_s) == 0) continue;

		XX=1;
		(trpt+1)->bup.ovals = grab_ints(3);
		(trpt+1)->bup.ovals[0] = ((int)((P2 *)_this)->v);
		;
		((P2 *)_this)->v = qrecv(now.sb_s, XX-1, 0, 1);
#ifdef VAR_RANGES
		logval("DrainS:v", ((int)((P2 *)_this)->v));
#endif
		;
		
#ifdef HAS_CODE
		if (readtrail && gui) {
			char simtmp[32];
			sprintf(simvals, "%d?", now.sb_s);
		sprintf(simtmp, "%d", ((int)((P2 *)_this)->v)); strcat(simvals, simtmp);		}
#endif
		;
		/* merge: epoch_mem = v(5, 2, 5) */
		reached[2][2] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.epoch_mem);
		now.epoch_mem = ((int)((P2 *)_this)->v);
#ifdef VAR_RANGES
		logval("epoch_mem", ((int)now.epoch_mem));
#endif
		;
		/* merge: v = 0(5, 3, 5) */
		reached[2][3] = 1;
		(trpt+1)->bup.ovals[2] = ((int)((P2 *)_this)->v);
		((P2 *)_this)->v = 0;
#ifdef VAR_RANGES
		logval("DrainS:v", ((int)((P2 *)_this)->v));
#endif
		;
		/* merge: .(goto)(0, 6, 5) */
		reached[2][6] = 1;
		;
		_m = 4; goto P999; /* 3 */
	case 58: // STATE 8 - lease_fence_tso.pml:114 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[2][8] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC DrainH */
	case 59: // STATE 1 - lease_fence_tso.pml:105 - [sb_h?v] (5:0:3 - 1)
		reached[1][1] = 1;
		if (q_len(now.sb_h) == 0) continue;

		XX=1;
		(trpt+1)->bup.ovals = grab_ints(3);
		(trpt+1)->bup.ovals[0] = ((int)((P1 *)_this)->v);
		;
		((P1 *)_this)->v = qrecv(now.sb_h, XX-1, 0, 1);
#ifdef VAR_RANGES
		logval("DrainH:v", ((int)((P1 *)_this)->v));
#endif
		;
		
#ifdef HAS_CODE
		if (readtrail && gui) {
			char simtmp[32];
			sprintf(simvals, "%d?", now.sb_h);
		sprintf(simtmp, "%d", ((int)((P1 *)_this)->v)); strcat(simvals, simtmp);		}
#endif
		;
		/* merge: beat_mem = v(5, 2, 5) */
		reached[1][2] = 1;
		(trpt+1)->bup.ovals[1] = ((int)now.beat_mem);
		now.beat_mem = ((int)((P1 *)_this)->v);
#ifdef VAR_RANGES
		logval("beat_mem", ((int)now.beat_mem));
#endif
		;
		/* merge: v = 0(5, 3, 5) */
		reached[1][3] = 1;
		(trpt+1)->bup.ovals[2] = ((int)((P1 *)_this)->v);
		((P1 *)_this)->v = 0;
#ifdef VAR_RANGES
		logval("DrainH:v", ((int)((P1 *)_this)->v));
#endif
		;
		/* merge: .(goto)(0, 6, 5) */
		reached[1][6] = 1;
		;
		_m = 4; goto P999; /* 3 */
	case 60: // STATE 8 - lease_fence_tso.pml:107 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[1][8] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */

		 /* PROC Clock */
	case 61: // STATE 1 - lease_fence_tso.pml:98 - [(((now<9)&&(!(in_window)||(now<(check_time+((2*1)-1))))))] (4:0:1 - 1)
		IfNotBlocked
		reached[0][1] = 1;
		if (!(((((int)now.now)<9)&&( !(((int)now.in_window))||(((int)now.now)<(((int)now.check_time)+((2*1)-1)))))))
			continue;
		/* merge: now = (now+1)(0, 2, 4) */
		reached[0][2] = 1;
		(trpt+1)->bup.oval = ((int)now.now);
		now.now = (((int)now.now)+1);
#ifdef VAR_RANGES
		logval("now", ((int)now.now));
#endif
		;
		/* merge: .(goto)(0, 5, 4) */
		reached[0][5] = 1;
		;
		_m = 3; goto P999; /* 2 */
	case 62: // STATE 7 - lease_fence_tso.pml:100 - [-end-] (0:0:0 - 1)
		IfNotBlocked
		reached[0][7] = 1;
		if (!delproc(1, II)) continue;
		_m = 3; goto P999; /* 0 */
	case  _T5:	/* np_ */
		if (!((!(trpt->o_pm&4) && !(trpt->tau&128))))
			continue;
		/* else fall through */
	case  _T2:	/* true */
		_m = 3; goto P999;
#undef rand
	}

