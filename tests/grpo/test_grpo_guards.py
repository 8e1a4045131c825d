"""Training-health detectors (rlvr_core.experiment.guards): G-collapse, G-entropy, G-reward-hacking, G-kl-explosion.

Planted failures reproduce the numbers of the seed incidents (shared/seeds/001_*, 002_*; BUGZOO rows), healthy
rows come from a real run of the trainer (embedded below) and from seeded synthetic runs with the real run's
spread, and two real trainer runs on the tiny test model (a normal and a collapsing learning rate) close the loop.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest

from rlvr_core.experiment.guards import (GUARD_COLLAPSE, GUARD_ENTROPY, GUARD_IDS, GUARD_KL_EXPLOSION,
                                         GUARD_REWARD_HACKING, CollapseConfig, EntropyConfig, Firing, HealthConfig,
                                         KLExplosionConfig,
                                         HealthMonitor, RewardHackingConfig, check_health, detect_collapse,
                                         detect_entropy, detect_kl_explosion, detect_reward_hacking, health_flags)

# --------------------------------------------------------------------------------------------------------------
# A real healthy run: docs/grpo_training.md run k3 (demo base model, P x G 16 x 8, lr 3e-4 warm-up 10, beta 0.1
# k2, 200 steps, held-out greedy accuracy on 200 problems every 25 steps; base 0.260, end 0.335). Columns as in
# steps.parquet; "-" = NaN / not evaluated. Its held-out score dipped to 0.200 at step 25 and recovered: a guard
# must not call that reward hacking. The trainer's per-step kl_spike_max=10 flag fired on 43 of its steps.
REAL_COLUMNS = ("step", "reward_mean", "grad_norm", "completion_len_mean", "truncation_share", "entropy",
                "ratio_max", "ratio_min", "kl_ref_mean", "kl_ref_max", "unique_frac_mean", "eval/greedy")
REAL_K3 = """
1 0.2109 0.3787 22.4375 0 0.3962 1.000007 0.999995 0 0.000 0.9688 -
2 0.1875 0.3419 22.2422 0 0.4138 1.000007 0.999996 0.0004 0.064 0.9844 -
3 0.1562 0.2735 22.4375 0 0.4272 1.000004 0.999996 0.0025 0.262 0.9844 -
4 0.125 0.4632 22.4688 0 0.4244 1.000005 0.999996 0.0114 2.905 1 -
5 0.2031 0.3277 22.7266 0 0.4177 1.000005 0.999994 0.0098 2.540 0.9766 -
6 0.2734 0.3501 22.0781 0 0.3943 1.000007 0.999994 0.0114 1.619 0.9688 -
7 0.2656 0.577 22.8906 0 0.3941 1.000004 0.999986 0.02 1.910 0.9453 -
8 0.2422 0.6447 22.1406 0 0.3868 1.000010 0.999992 0.0343 3.064 0.9688 -
9 0.2031 0.4393 22.5781 0 0.3739 1.000006 0.999995 0.0546 16.137 0.9375 -
10 0.1094 0.421 21.7266 0 0.3609 1.000005 0.999990 0.0791 17.263 0.9375 -
11 0.0547 0.2143 22.8359 0 0.3723 1.000007 0.999990 0.0649 6.785 0.9844 -
12 0.1016 0.4456 22.5234 0 0.3662 1.000008 0.999996 0.0674 15.043 0.9297 -
13 0.2734 0.3719 22.2734 0 0.381 1.000006 0.999991 0.0498 7.039 0.9453 -
14 0.2578 0.2749 22 0 0.3881 1.000006 0.999991 0.0424 6.843 0.9688 -
15 0.2266 0.2004 22.9844 0.0078 0.4155 1.000009 0.999993 0.0434 6.648 0.9844 -
16 0.2422 0.3536 23.3984 0 0.4261 1.000035 0.999995 0.0522 7.047 0.9453 -
17 0.125 0.5313 22.6641 0 0.4155 1.000011 0.999989 0.0599 12.947 0.9766 -
18 0.0859 0.2682 23.1406 0 0.4452 1.000007 0.999992 0.0654 6.272 0.9922 -
19 0.2109 0.3694 22.6172 0 0.416 1.000025 0.999995 0.0826 10.378 0.9609 -
20 0.125 0.2642 22.7266 0 0.415 1.000004 0.999995 0.0669 5.104 0.9688 -
21 0.1719 0.3642 21.875 0 0.4134 1.000004 0.999991 0.0593 7.612 0.9922 -
22 0.125 0.3145 22.0938 0 0.4155 1.000010 0.999995 0.0662 9.228 1 -
23 0.0938 0.4965 22.3984 0 0.4446 1.000005 0.999991 0.0705 14.218 0.9844 -
24 0.1328 0.3399 22.0547 0 0.4173 1.000005 0.999993 0.0625 5.142 0.9844 -
25 0.1641 0.3062 22.0781 0 0.3968 1.000005 0.999995 0.0456 6.871 0.9844 0.2
26 0.1953 0.3433 22.0703 0 0.4156 1.000004 0.999987 0.0415 7.148 0.9766 -
27 0.1875 0.257 22.1094 0 0.4032 1.000007 0.999995 0.0417 5.847 0.9766 -
28 0.2109 0.2385 22.4531 0 0.4162 1.000006 0.999992 0.0429 4.426 0.9688 -
29 0.2344 0.2777 22.3672 0 0.3989 1.000010 0.999997 0.0479 7.385 0.9531 -
30 0.125 0.3916 21.9375 0 0.4073 1.000009 0.999995 0.0506 11.426 0.9766 -
31 0.1953 0.299 22.4453 0 0.4172 1.000004 0.999995 0.0595 6.200 0.9766 -
32 0.3125 0.4229 21.8984 0 0.3705 1.000006 0.999994 0.0576 7.987 0.9531 -
33 0.1406 0.7009 22.1875 0 0.4107 1.000007 0.999994 0.06 7.588 0.9688 -
34 0.2422 0.3362 22.5391 0 0.3927 1.000004 0.999995 0.0549 7.106 0.9531 -
35 0.2578 0.4906 22.0312 0 0.38 1.000006 0.999997 0.0839 7.317 0.9141 -
36 0.1953 0.2524 22.4062 0 0.3569 1.000008 0.999995 0.0948 6.846 0.9297 -
37 0.1484 0.3356 22.875 0 0.3994 1.000005 0.999994 0.1071 14.387 0.9688 -
38 0.2031 0.4489 22.0391 0 0.3633 1.000004 0.999990 0.0756 10.352 0.9141 -
39 0.2734 0.4631 21.875 0 0.3747 1.000010 0.999990 0.0992 12.320 0.9844 -
40 0.3125 0.5173 22.2031 0 0.3744 1.000005 0.999992 0.0923 24.057 0.9609 -
41 0.1875 0.2889 21.9688 0 0.3862 1.000010 0.999987 0.0843 7.777 0.9297 -
42 0.1172 0.2388 22.0703 0 0.4035 1.000016 0.999996 0.0576 7.435 0.9766 -
43 0.1875 0.2532 21.8516 0 0.4124 1.000004 0.999994 0.0592 16.010 0.9531 -
44 0.2344 0.3353 22.1172 0 0.3887 1.000003 0.999996 0.0437 5.563 0.9531 -
45 0.2031 0.4279 21.8672 0 0.4309 1.000014 0.999987 0.0629 4.443 0.9844 -
46 0.1875 0.3245 21.6406 0 0.436 1.000008 0.999987 0.0572 9.088 0.9922 -
47 0.2031 0.4179 21.7422 0 0.44 1.000005 0.999995 0.0575 14.290 0.9766 -
48 0.1562 0.4292 21.9766 0 0.4256 1.000008 0.999994 0.0574 21.935 0.9609 -
49 0.2109 0.3886 21.9219 0 0.3928 1.000003 0.999994 0.0477 4.236 0.9844 -
50 0.1797 0.4419 22.5703 0 0.4115 1.000008 0.999996 0.0543 6.410 0.9844 0.285
51 0.1719 0.3478 22.3047 0 0.436 1.000005 0.999990 0.0512 4.952 1 -
52 0.2344 0.5045 21.4688 0 0.3578 1.000006 0.999994 0.0509 9.884 0.9688 -
53 0.3047 0.3359 21.9297 0 0.3947 1.000006 0.999996 0.0362 4.179 0.9766 -
54 0.25 0.3431 22.3438 0 0.3901 1.000006 0.999995 0.0551 5.649 0.9297 -
55 0.1719 0.3797 22.5078 0 0.3835 1.000008 0.999994 0.0541 6.781 0.9531 -
56 0.2188 0.2626 21.7734 0 0.3794 1.000007 0.999994 0.0574 8.270 0.9688 -
57 0.3125 0.3137 21.9922 0 0.357 1.000005 0.999995 0.0525 6.756 0.8984 -
58 0.2109 0.3456 22.5859 0 0.4098 1.000008 0.999993 0.0658 8.834 0.9688 -
59 0.1328 0.3847 22.3047 0 0.3977 1.000020 0.999993 0.0487 10.518 0.9844 -
60 0.1562 0.4554 22.2109 0 0.3862 1.000008 0.999991 0.07 19.375 0.9453 -
61 0.1016 0.3307 22.5859 0 0.3962 1.000003 0.999993 0.0632 14.474 1 -
62 0.0938 0.3563 22.2578 0 0.3792 1.000008 0.999994 0.0647 5.834 0.9688 -
63 0.1562 0.3572 22.25 0 0.4202 1.000012 0.999997 0.0594 5.203 0.9453 -
64 0.2656 0.3488 21.9453 0 0.4008 1.000016 0.999993 0.0609 7.801 0.9844 -
65 0.1875 0.3302 21.9844 0 0.3753 1.000012 0.999995 0.057 16.320 0.9688 -
66 0.1719 0.3459 22.375 0 0.3765 1.000004 0.999995 0.0611 11.301 0.9688 -
67 0.1953 0.656 21.75 0 0.3626 1.000010 0.999992 0.0477 27.750 0.9219 -
68 0.1719 0.3825 22.0469 0 0.3903 1.000005 0.999996 0.0449 8.592 0.9766 -
69 0.1328 0.2828 22.5625 0 0.4096 1.000005 0.999994 0.039 8.195 0.9453 -
70 0.2344 0.3706 22.3984 0 0.3853 1.000007 0.999994 0.0441 5.784 0.9688 -
71 0.2266 0.2791 22.375 0 0.3831 1.000004 0.999994 0.042 11.608 0.9219 -
72 0.2188 0.313 21.7422 0 0.4205 1.000007 0.999995 0.039 4.894 0.9766 -
73 0.2188 0.3145 22.25 0 0.3788 1.000006 0.999994 0.0427 5.726 0.9688 -
74 0.1406 0.2125 22.4922 0 0.4106 1.000008 0.999995 0.0357 5.309 0.9922 -
75 0.1797 0.3393 22.5547 0 0.3881 1.000008 0.999986 0.0377 2.917 0.9453 0.255
76 0.1172 0.2595 22.4375 0 0.4002 1.000006 0.999996 0.0369 5.470 0.9844 -
77 0.2109 0.3187 22.1562 0 0.3813 1.000005 0.999992 0.0359 4.439 0.9688 -
78 0.2656 0.3013 22.125 0 0.4043 1.000005 0.999994 0.0405 5.812 0.9922 -
79 0.1094 0.2063 22.7422 0 0.368 1.000005 0.999990 0.03 2.412 0.9609 -
80 0.1172 0.3271 22.1484 0 0.3885 1.000015 0.999994 0.0451 4.691 0.9609 -
81 0.2266 0.3693 22.6641 0 0.3674 1.000008 0.999991 0.046 7.029 0.9922 -
82 0.1562 0.2347 22.5078 0 0.3718 1.000006 0.999995 0.0468 7.648 0.9766 -
83 0.3125 0.8061 22.5859 0 0.3605 1.000006 0.999996 0.046 6.591 0.9297 -
84 0.2109 0.2247 22.0234 0 0.3346 1.000012 0.999990 0.0652 6.319 0.9609 -
85 0.1797 0.2508 22.7422 0 0.3755 1.000023 0.999991 0.0508 8.162 0.9609 -
86 0.1797 0.6139 22.125 0 0.3294 1.000008 0.999992 0.0546 6.595 0.9453 -
87 0.1953 0.2539 22.0312 0 0.323 1.000003 0.999995 0.0639 14.710 0.9375 -
88 0.1797 0.4181 23.1094 0 0.3733 1.000005 0.999996 0.0521 11.418 0.9609 -
89 0.1641 0.1999 22.8984 0 0.3633 1.000008 0.999991 0.0572 6.819 0.9141 -
90 0.2969 0.3755 22.6562 0 0.3357 1.000010 0.999987 0.0573 6.386 0.875 -
91 0.1953 0.603 22.375 0 0.3243 1.000007 0.999995 0.0815 21.295 0.9297 -
92 0.1484 0.297 22.5078 0 0.3557 1.000007 0.999989 0.0641 6.504 0.9531 -
93 0.1719 0.4217 22.625 0 0.3545 1.000008 0.999991 0.0602 9.664 0.9844 -
94 0.2578 0.2799 21.5234 0 0.3299 1.000004 0.999996 0.0583 27.965 0.9297 -
95 0.2344 0.2249 21.875 0 0.3588 1.000008 0.999993 0.0406 4.008 0.9609 -
96 0.1797 0.3744 22.3828 0 0.3782 1.000013 0.999994 0.0508 5.924 0.9609 -
97 0.2031 0.5636 22.6953 0 0.4066 1.000005 0.999996 0.04 10.159 0.9844 -
98 0.1562 0.2847 22.1719 0 0.4181 1.000007 0.999997 0.0437 7.667 0.9922 -
99 0.2344 0.4337 21.9453 0 0.3595 1.000005 0.999973 0.0411 8.842 0.9453 -
100 0.1484 0.328 23.3516 0 0.3887 1.000006 0.999994 0.0489 5.811 0.9531 0.265
101 0.2188 0.1861 22.6094 0 0.375 1.000004 0.999996 0.0554 9.512 0.9375 -
102 0.1719 0.351 22.1562 0 0.3741 1.000003 0.999995 0.0531 14.220 0.9688 -
103 0.1562 0.347 22.7266 0 0.3692 1.000004 0.999990 0.0575 14.774 0.9453 -
104 0.1172 0.2802 22.5234 0 0.3895 1.000008 0.999996 0.0458 12.332 0.9844 -
105 0.2031 0.2659 22.6641 0 0.4002 1.000006 0.999996 0.0384 6.651 0.9922 -
106 0.1562 0.3482 22.3438 0 0.4188 1.000008 0.999988 0.0421 7.956 0.9922 -
107 0.1953 0.2735 22.25 0 0.4067 1.000005 0.999990 0.0232 3.385 0.9531 -
108 0.1719 0.2383 22.4844 0 0.385 1.000010 0.999996 0.0234 2.449 0.9453 -
109 0.2812 0.3927 22.3516 0 0.3896 1.000009 0.999995 0.0458 6.313 0.9375 -
110 0.2031 0.3575 21.7266 0 0.3952 1.000008 0.999996 0.0383 9.340 0.9609 -
111 0.2188 0.3896 22.6172 0 0.3724 1.000008 0.999995 0.0414 6.569 0.9609 -
112 0.1641 0.371 22.8281 0 0.4309 1.000005 0.999996 0.0381 5.464 0.9844 -
113 0.2031 0.3822 22.9219 0 0.4257 1.000006 0.999984 0.0492 7.224 0.9609 -
114 0.1406 0.3016 22.4609 0 0.3801 1.000006 0.999996 0.0462 5.958 0.9766 -
115 0.3828 0.3684 21.7031 0 0.3398 1.000004 0.999994 0.0313 5.137 0.8906 -
116 0.1484 0.3075 22.1406 0 0.3769 1.000007 0.999995 0.0412 6.905 0.9531 -
117 0.1953 0.4819 21.9531 0 0.3554 1.000005 0.999992 0.0334 4.296 0.9062 -
118 0.1719 0.3732 22.2344 0 0.3818 1.000007 0.999990 0.0354 4.090 0.9766 -
119 0.125 0.2951 22.1562 0 0.3782 1.000009 0.999996 0.0424 5.844 0.9531 -
120 0.2422 0.3273 22.8359 0 0.4106 1.000005 0.999995 0.0292 4.955 0.9844 -
121 0.1875 0.269 22.3984 0 0.3844 1.000028 0.999995 0.0283 4.546 0.9688 -
122 0.1094 0.2452 22.1953 0 0.4046 1.000018 0.999992 0.0315 6.029 1 -
123 0.2422 0.2892 22.8203 0 0.3847 1.000006 0.999994 0.0353 5.991 0.9453 -
124 0.1641 0.2496 22.0234 0 0.375 1.000010 0.999988 0.0277 8.149 0.9453 -
125 0.1719 0.2266 22.125 0 0.3892 1.000004 0.999995 0.0307 4.678 0.9844 0.275
126 0.2578 0.322 22.4609 0 0.3641 1.000004 0.999996 0.0343 11.156 0.9531 -
127 0.2188 0.3423 21.9531 0 0.3843 1.000003 0.999987 0.0331 4.862 0.9844 -
128 0.1406 0.2142 22.2656 0 0.3936 1.000013 0.999996 0.0392 5.727 0.9688 -
129 0.2109 0.3929 22.4141 0 0.3738 1.000007 0.999996 0.041 7.992 0.9844 -
130 0.2266 0.265 22.375 0 0.3783 1.000003 0.999990 0.0488 11.689 0.9453 -
131 0.3203 0.3595 22.1172 0 0.3544 1.000006 0.999997 0.0408 6.625 0.9141 -
132 0.2109 0.2908 22.5547 0 0.3663 1.000007 0.999992 0.0458 14.300 0.9219 -
133 0.2422 0.4053 22.4453 0 0.379 1.000005 0.999993 0.0433 14.431 0.9531 -
134 0.2266 0.201 22.3828 0 0.3649 1.000045 0.999992 0.0343 5.123 0.9375 -
135 0.2188 0.4359 21.5703 0 0.36 1.000004 0.999996 0.0558 16.510 0.9531 -
136 0.1094 0.4029 22.2266 0 0.3801 1.000003 0.999996 0.0427 7.119 0.9844 -
137 0.1562 0.2463 22.0703 0 0.3355 1.000003 0.999993 0.0332 6.526 0.9297 -
138 0.2891 0.2601 21.875 0 0.3526 1.000004 0.999996 0.0346 4.634 0.8984 -
139 0.3203 0.3303 21.8984 0 0.3657 1.000009 0.999994 0.0351 4.586 0.9297 -
140 0.2891 0.3406 22.4609 0 0.374 1.000005 0.999995 0.0361 7.202 0.9531 -
141 0.25 0.2822 22.9219 0 0.3766 1.000003 0.999997 0.0284 3.381 0.9297 -
142 0.2188 0.24 22.625 0 0.3689 1.000005 0.999994 0.0349 5.715 0.9297 -
143 0.1641 0.3302 22.7188 0 0.3966 1.000003 0.999994 0.036 5.169 0.9766 -
144 0.1953 0.2913 22.2812 0 0.3481 1.000006 0.999995 0.0422 6.739 0.9688 -
145 0.2266 0.2855 22.4688 0 0.3837 1.000007 0.999995 0.0363 5.514 0.9766 -
146 0.2188 0.3688 22 0 0.3795 1.000008 0.999995 0.0266 4.878 0.9766 -
147 0.25 0.379 22.4609 0 0.3772 1.000006 0.999994 0.0309 5.125 0.9453 -
148 0.0781 0.2865 22.4688 0 0.4007 1.000014 0.999995 0.0189 2.574 0.9688 -
149 0.25 0.2673 22.4062 0 0.3649 1.000008 0.999996 0.0305 4.765 0.9297 -
150 0.1719 0.2541 22.3047 0 0.3647 1.000004 0.999994 0.0448 10.259 0.9609 0.315
151 0.2656 0.3222 22.125 0 0.3694 1.000005 0.999994 0.0385 5.144 0.9531 -
152 0.25 0.3761 21.8672 0 0.3776 1.000005 0.999993 0.0403 9.413 0.9688 -
153 0.25 0.3338 22.5781 0 0.3785 1.000007 0.999990 0.031 4.127 0.9609 -
154 0.3281 0.2892 22.5781 0 0.3517 1.000005 0.999995 0.0323 6.298 0.9062 -
155 0.2031 0.3137 21.7734 0 0.3675 1.000007 0.999996 0.0345 6.416 0.9297 -
156 0.1953 0.2503 22.7344 0 0.3679 1.000008 0.999994 0.0364 5.386 0.9766 -
157 0.375 0.309 21.5156 0 0.3138 1.000003 0.999996 0.0509 7.515 0.8984 -
158 0.1797 0.2683 22.4609 0 0.3743 1.000005 0.999997 0.0315 3.080 0.9609 -
159 0.3672 0.3638 22.2578 0 0.3617 1.000005 0.999991 0.0598 88.090 0.8906 -
160 0.2188 0.2567 21.8047 0 0.3553 1.000006 0.999987 0.0427 6.601 0.9609 -
161 0.2578 0.3554 22.6562 0 0.3507 1.000010 0.999995 0.0389 16.756 0.9062 -
162 0.1562 0.2876 22.9609 0 0.3975 1.000010 0.999995 0.0251 2.082 0.9609 -
163 0.2266 0.2993 22.3438 0 0.3408 1.000005 0.999995 0.0384 5.971 0.9531 -
164 0.2734 0.4719 22.1641 0 0.3562 1.000033 0.999993 0.0606 20.000 0.9453 -
165 0.3828 0.3764 22.2422 0 0.3458 1.000004 0.999994 0.0353 5.297 0.9062 -
166 0.1875 0.2869 22.2969 0 0.3523 1.000010 0.999992 0.034 4.700 0.9375 -
167 0.1953 0.4604 22.2891 0 0.355 1.000008 0.999987 0.0445 7.290 0.9609 -
168 0.25 0.3635 22.3125 0 0.3639 1.000007 0.999989 0.0431 5.557 0.9375 -
169 0.2891 0.3353 21.9688 0 0.3231 1.000004 0.999988 0.0381 7.950 0.9219 -
170 0.2891 0.4664 21.7812 0 0.365 1.000010 0.999993 0.0343 5.111 0.9609 -
171 0.1953 0.3069 21.8672 0 0.3677 1.000003 0.999995 0.0488 23.833 0.9453 -
172 0.2188 0.2678 22.1719 0 0.3613 1.000004 0.999995 0.0359 7.866 0.9062 -
173 0.1172 0.428 22.0078 0 0.3535 1.000005 0.999996 0.0384 10.531 0.9609 -
174 0.2891 0.3627 21.9531 0 0.3432 1.000005 0.999996 0.0342 6.448 0.9219 -
175 0.2109 0.3878 22.8125 0 0.3628 1.000083 0.999993 0.0308 7.216 0.9531 0.335
176 0.1641 0.3122 22.5156 0 0.397 1.000006 0.999994 0.0267 5.396 0.9844 -
177 0.2734 0.3406 21.5547 0 0.3184 1.000003 0.999992 0.0469 7.957 0.9141 -
178 0.3438 0.3904 22.2969 0 0.3622 1.000018 0.999995 0.0414 6.241 0.9453 -
179 0.2266 0.3395 22.3125 0 0.3616 1.000006 0.999994 0.0325 5.718 0.9688 -
180 0.2031 0.3786 22.4766 0 0.3662 1.000004 0.999997 0.0287 4.873 0.8984 -
181 0.2969 0.3709 22.0703 0 0.3592 1.000005 0.999995 0.0433 8.060 0.9688 -
182 0.3438 0.3785 22.4297 0 0.35 1.000006 0.999995 0.0309 5.118 0.9219 -
183 0.2266 0.3412 22.5156 0 0.382 1.000005 0.999993 0.0444 17.669 0.9375 -
184 0.2031 0.4014 22.2109 0 0.3907 1.000015 0.999997 0.0347 5.624 0.9766 -
185 0.3203 0.4798 21.8359 0 0.3604 1.000006 0.999996 0.0433 5.754 0.9062 -
186 0.1562 0.4307 22.7656 0 0.3934 1.000008 0.999989 0.036 5.807 0.9766 -
187 0.2188 0.2474 22.0703 0 0.3434 1.000007 0.999996 0.036 6.384 0.9375 -
188 0.1875 0.3543 22.1641 0 0.3917 1.000006 0.999995 0.0347 4.998 0.9609 -
189 0.3281 0.4519 22.1406 0 0.3763 1.000004 0.999995 0.0321 5.703 0.9688 -
190 0.2578 0.2767 22.2188 0 0.3515 1.000005 0.999997 0.026 6.107 0.9297 -
191 0.2422 0.4525 22.3125 0 0.3744 1.000009 0.999995 0.0605 46.111 0.9609 -
192 0.2344 0.3915 21.6562 0 0.3422 1.000006 0.999993 0.0266 3.286 0.9609 -
193 0.1562 0.3016 22.0625 0 0.365 1.000014 0.999993 0.0329 6.313 0.9688 -
194 0.2188 0.2743 22.5703 0 0.3829 1.000005 0.999994 0.029 6.715 0.9766 -
195 0.3828 0.3815 22.1719 0 0.3473 1.000008 0.999995 0.044 8.100 0.9219 -
196 0.2656 0.3987 22.1016 0 0.3415 1.000005 0.999986 0.0584 54.491 0.9219 -
197 0.1953 0.2946 21.6875 0 0.374 1.000011 0.999994 0.0362 6.913 0.9531 -
198 0.2031 0.3995 22.125 0 0.3449 1.000009 0.999992 0.035 5.123 0.875 -
199 0.1172 0.2628 22.5625 0 0.3786 1.000004 0.999992 0.0368 6.158 0.9766 -
200 0.25 0.3859 22.7578 0 0.355 1.000007 0.999990 0.0395 5.799 0.9844 0.335
"""


def real_k3_rows() -> list[dict]:
    rows = []
    for line in REAL_K3.strip().splitlines():
        vals = line.split()
        row = {"step": int(vals[0])}
        for k, v in zip(REAL_COLUMNS[1:], vals[1:]):
            if v != "-":
                row[k] = float(v)
            elif not k.startswith("eval/"):
                row[k] = float("nan")
        rows.append(row)
    return rows


def healthy_rows(n: int, seed: int = 0, *, reward: float | tuple[float, float] = 0.21, grad: float = 0.34,
                 entropy: float | tuple[float, float] = 0.38, length: float | tuple[float, float] = 22.3,
                 kl: bool = True) -> list[dict]:
    """Seeded synthetic healthy steps with the spread of the real runs k1-k3 (docs/grpo_training.md):
    reward sd 0.06 per step (128 samples), grad norm log-normal (p95/p50 = 1.5), entropy sd 0.022, length
    sd 0.37 tokens, kl_ref_max log-normal around 6 with a tail to ~100, unique share 0.955 sd 0.027.
    A tuple (start, end) makes the level drift linearly over the run (a run that learns)."""
    rng = random.Random(seed)

    def level(v, i):
        return v[0] + (v[1] - v[0]) * i / max(1, n - 1) if isinstance(v, tuple) else v

    rows = []
    for i in range(n):
        r = {"step": i + 1,
             "reward_mean": min(1.0, max(0.0, rng.gauss(level(reward, i), 0.06))),
             "grad_norm": grad * math.exp(rng.gauss(0, 0.26)),
             "completion_len_mean": rng.gauss(level(length, i), 0.37),
             "truncation_share": 0.0,
             "entropy": max(0.0, rng.gauss(level(entropy, i), 0.022)),
             "ratio_max": 1 + rng.uniform(3e-6, 3e-5), "ratio_min": 1 - rng.uniform(3e-6, 3e-5),
             "unique_frac_mean": min(1.0, rng.gauss(0.955, 0.027)),
             "kl_ref_mean": max(0.0, rng.gauss(0.04, 0.015)) if kl else float("nan"),
             "kl_ref_max": 6 * math.exp(rng.gauss(0, 0.9)) if kl else float("nan")}
        rows.append(r)
    return rows


def only(firings: list[Firing], guard: str) -> list[Firing]:
    return [f for f in firings if f.guard_id == guard]


# ----------------------------------------------------------------------------------------- healthy: nothing fires
def test_real_healthy_run_fires_nothing():
    rows = real_k3_rows()
    assert len(rows) == 200 and sum("eval/greedy" in r for r in rows) == 8
    assert check_health(rows) == []
    # Against the base model's score (0.260; the step-25 eval was 0.200), and with the eval size known.
    cfg = HealthConfig(reward_hacking=RewardHackingConfig(base_eval={"greedy": 0.26}, eval_n=200))
    assert check_health(rows, cfg) == []
    # Even with one collapse signal enough, no signal ever trips on this run: the margins are real.
    assert detect_collapse(rows, CollapseConfig(min_signals=1)) == []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("regime", ["flat", "learning"])
def test_synthetic_healthy_runs_fire_nothing(seed, regime):
    # 600 steps. "learning": reward 0.2 -> 0.7, entropy -45%, responses 30% shorter, held-out accuracy 0.26 -> 0.36.
    if regime == "flat":
        rows = healthy_rows(600, seed)
        acc = lambda i: 0.30  # noqa: E731
    else:
        rows = healthy_rows(600, seed, reward=(0.2, 0.7), entropy=(0.40, 0.22), length=(22.3, 15.6))
        acc = lambda i: 0.26 + 0.10 * i / 599  # noqa: E731
    rng = random.Random(1000 + seed)
    for i in range(24, 600, 25):  # eval every 25 steps on 2,000 held-out problems (binomial noise, sd ~1 point)
        rows[i]["eval/acc"] = sum(rng.random() < acc(i) for _ in range(2000)) / 2000
        rows[i]["eval/acc_n"] = 2000
    assert check_health(rows) == []


# ----------------------------------------------------------------------------------------- G-collapse
def test_collapse_v5_grad_norm_spike_and_reward_to_zero():
    # seeds/001 "v5 (lr=2e-5, beta=0.03)": reward_all ~0.65 dropped to 0.00, grad_norm spiked to 46.75 (was ~0.4-0.5).
    rows = healthy_rows(160, 1, reward=0.65, grad=0.45)
    spikes = [46.75, 31.0, 38.2, 44.0, 29.5, 40.1, 35.3, 46.0, 33.3, 41.7]
    for r, g in zip(rows[150:], spikes):
        r["grad_norm"], r["reward_mean"] = g, 0.0
    assert check_health(rows[:152]) == []  # steps 151-152: the grad spike alone is one signal, not a collapse
    fired = only(check_health(rows), GUARD_COLLAPSE)
    assert len(fired) == 1
    f = fired[0]
    # Step 153: the third zero-reward step makes the 5-step median 0 (step 151's spike is in the window).
    assert f.step == 153 and f.serious
    assert set(f.evidence["signals"]) == {"grad_norm", "reward"}
    assert f.evidence["grad_norm"]["window_max"] == 46.75
    assert 0.4 < f.evidence["grad_norm"]["baseline_median"] < 0.5
    assert f.evidence["reward"]["window_median"] == 0.0 and f.evidence["reward"]["peak_window_median"] > 0.6
    assert "46.75" in f.reason and "reward median 0" in f.reason and "step 153" in f.reason


def test_collapse_drgrpo_grad_norm_148_and_one_token_median_completion():
    # seeds/001 DrGRPO lr=5e-5: grad_norm 46 -> 148 late in training, median completion length 1 token.
    rows = healthy_rows(100, 2, reward=0.5, grad=0.45, length=210.0)
    for r in rows:
        r["completion_len_median"] = r["completion_len_mean"] - 8
    for r, g in zip(rows[80:], [46.75, 60.0, 95.0, 148.0, 120.0, 140.0, 148.0, 130.0, 110.0, 148.0]):
        r["grad_norm"] = g
    for r in rows[82:]:
        r["completion_len_median"], r["completion_len_mean"] = 1.0, 2.4
        r["reward_mean"] = 0.34  # pass@1 fell (54% -> 34%) but not to ~0: not a reward signal
    fired = only(check_health(rows), GUARD_COLLAPSE)
    assert [f.step for f in fired] == [85]  # length 1 from step 83: median of 5 at step 85
    f = fired[0]
    assert set(f.evidence["signals"]) == {"grad_norm", "completion_len"}
    assert f.evidence["completion_len"]["column"] == "completion_len_median"  # the median is used when present
    assert f.evidence["completion_len"]["window_median"] == 1.0
    assert f.evidence["grad_norm"]["window_max"] == 148.0
    assert "148" in f.reason and "median completion length 1 tokens" in f.reason


def test_collapse_arc_ratio_21_75_and_4444_repetition():
    # seeds/002 ARC: PPO ratio 1.17 -> 21.75, output "4444...", reward crashed (accuracy 0%). G = 8.
    rows = healthy_rows(80, 3)
    for r in rows:
        r["ratio_max"] = 1.1719  # multi-epoch PPO: a healthy ratio_max above 1 must not trip the signal
    for r in rows[60:]:
        r["ratio_max"], r["unique_frac_mean"], r["reward_mean"] = 21.75, 1 / 8, 0.0
    rows[70]["ratio_max"] = 26.25
    fired = only(check_health(rows), GUARD_COLLAPSE)
    assert [f.step for f in fired] == [63]
    f = fired[0]
    assert set(f.evidence["signals"]) == {"ratio", "repetition", "reward"}
    assert f.evidence["ratio"]["window_max"] == 21.75 and f.evidence["repetition"]["window_median"] == 0.125
    assert "21.75" in f.reason and "unique-completion share 0.125" in f.reason


def test_stale_rollouts_ratio_extremes_are_not_a_collapse_signal():
    # A real staleness-1 demo run (lr 2e-4, easy-to-hard curriculum) was stopped at step 74 by two signals:
    # the reward median fell from 0.70 to 0.17 (later prompts are harder) and one token's ratio reached
    # 0.032. Ratio mean stayed 1.000, clip fraction <= 0.007, entropy and KL steady: not a collapse. With
    # stale rollouts the ratio measures the last update's movement, so only staleness-0 steps count.
    rows = healthy_rows(80, 6, reward=(0.8, 0.15))
    for r in rows:
        r["staleness"] = 1
        r["ratio_max"], r["ratio_min"] = 1.6, 0.6
    rows[70]["ratio_min"] = 0.032
    assert detect_collapse(rows) == []
    for r in rows:  # the same numbers on-policy would mean the trainer and sampler disagree: it fires
        r["staleness"] = 0
    fired = detect_collapse(rows)
    assert [f.step for f in fired] == [71] and set(fired[0].evidence["signals"]) == {"ratio", "reward"}


PLANTS = {  # one collapse signal each, from the onset step on; lag = steps until the 5-step window shows it
    "grad_norm": (lambda r: r.update(grad_norm=r["grad_norm"] * 20), 0),
    "ratio": (lambda r: r.update(ratio_max=21.75), 0),
    "reward": (lambda r: r.update(reward_mean=0.0), 2),
    "completion_len": (lambda r: r.update(completion_len_mean=1.5), 2),
    "truncation": (lambda r: r.update(truncation_share=1.0), 2),
    "entropy": (lambda r: r.update(entropy=0.005), 2),
    "repetition": (lambda r: r.update(unique_frac_mean=0.125), 2),
}


@pytest.mark.parametrize("signal", sorted(PLANTS))
def test_one_collapse_signal_alone_does_not_stop_the_run(signal):
    rows = healthy_rows(80, 4)
    for r in rows[50:]:
        PLANTS[signal][0](r)
    assert detect_collapse(rows) == []
    # ...but it is seen: with min_signals=1 it fires at the onset (+ the window lag) and names only itself.
    f = detect_collapse(rows, CollapseConfig(min_signals=1))
    assert [x.step for x in f] == [51 + PLANTS[signal][1]] and f[0].evidence["signals"] == [signal]


@pytest.mark.parametrize("pair", [("grad_norm", "reward"), ("entropy", "repetition"), ("ratio", "completion_len"),
                                  ("truncation", "reward"), ("grad_norm", "ratio"), ("completion_len", "entropy")])
def test_two_collapse_signals_fire_at_the_step_both_show(pair):
    rows = healthy_rows(80, 5)
    for r in rows[50:]:
        for s in pair:
            PLANTS[s][0](r)
    fired = detect_collapse(rows)
    assert [f.step for f in fired] == [51 + max(PLANTS[s][1] for s in pair)]
    assert set(fired[0].evidence["signals"]) == set(pair) and fired[0].serious


def test_collapse_demo_runs_t1_and_t3():
    # docs/grpo_training.md t1 (lr 1e-3): train reward 0.21 -> 0.04, every completion truncated at 48 tokens.
    rows = healthy_rows(40, 17)
    for r in rows[30:]:
        r["reward_mean"], r["truncation_share"], r["completion_len_mean"] = 0.04, 1.0, 48.0
    f = detect_collapse(rows)
    assert [x.step for x in f] == [33] and set(f[0].evidence["signals"]) == {"reward", "truncation"}
    # t3 (lr 5e-4): completions collapsed to ~8 tokens (from ~22.3: 0.36x, under the 0.4x floor), reward 0.05.
    rows = healthy_rows(100, 18)
    for r in rows[80:]:
        r["completion_len_mean"], r["reward_mean"] = 8.0, 0.05
    f = detect_collapse(rows)
    assert [x.step for x in f] == [83] and set(f[0].evidence["signals"]) == {"completion_len", "reward"}
    assert f[0].evidence["completion_len"]["floor"] == pytest.approx(0.4 * 22.3, rel=0.03)


def test_collapse_baseline_is_relative_to_the_run():
    # A model that always answers in ~3 tokens: 2.5 tokens is not "collapsed to 1-2 tokens" relative to itself
    # under the 0.4x rule, but the absolute 2-token floor still applies; grad norms of 40 are normal for it.
    rows = healthy_rows(60, 6, grad=40.0, length=3.0)
    for r in rows[40:]:
        r["completion_len_mean"], r["reward_mean"] = 2.5, 0.0
    assert detect_collapse(rows) == []  # only the reward signal
    for r in rows[40:]:
        r["completion_len_mean"] = 1.0
    assert [f.step for f in detect_collapse(rows)] == [43]


# ----------------------------------------------------------------------------------------- G-entropy
def _entropy_seed_rows(kl: bool = True) -> list[dict]:
    # seeds/001 IFEval lr=5e-6 beta=1e-4: entropy collapsed to 0.008 and kl_max reached 9748 at step 79;
    # "rollouts still coherent text". Entropy falls geometrically from 0.40 (step 59) to 0.008 (step 79),
    # kl_ref_max from 5 to 9748.
    rows = healthy_rows(79, 7, entropy=0.40, kl=kl)
    for s in range(60, 80):
        t = (s - 59) / 20
        rows[s - 1]["entropy"] = 0.40 * (0.008 / 0.40) ** t
        if kl:
            rows[s - 1]["kl_ref_max"] = 5 * (9748 / 5) ** t
            rows[s - 1]["kl_ref_mean"] = 0.04 + 0.15 * t
    return rows


def test_entropy_floor_then_kl_escalation_on_the_seed_numbers():
    rows = _entropy_seed_rows()
    assert rows[78]["entropy"] == pytest.approx(0.008) and rows[78]["kl_ref_max"] == pytest.approx(9748)
    fired = check_health(rows)
    ent = only(fired, GUARD_ENTROPY)
    # Floor = max(0.03, 0.2 x early median ~0.40) ~ 0.08. Entropy is below it from step 68 (0.069; step 67: 0.084),
    # so the 5-step median is from step 70: a flag. kl_ref_max first exceeds 1000 at step 73 (1,004; step 72: 688)
    # -> a second, serious firing inside the same low-entropy episode: deterministic and far from the reference.
    assert [f.step for f in ent] == [70, 73]
    assert not ent[0].serious and ent[0].key == "" and ent[0].evidence["floor"] == pytest.approx(0.08, abs=0.005)
    assert ent[1].serious and ent[1].key == "kl" and ent[1].evidence["kl_ref_max_window_max"] >= 1000
    assert "kl_ref_max" in ent[0].reason and "entropy median" in ent[0].reason
    final = detect_entropy(rows, EntropyConfig(serious_kl_max=None))
    assert [(f.step, f.serious) for f in final] == [(70, False)]
    # The same rows: the KL episode detector fires too, the collapse detector does not (one signal: entropy).
    assert [f.step for f in only(fired, GUARD_KL_EXPLOSION)] == [73]
    assert only(fired, GUARD_COLLAPSE) == []
    last = [f for f in detect_entropy(rows, EntropyConfig(serious_kl_max=9000))]
    assert [f.step for f in last] == [70, 79] and "9748" in last[1].reason


def test_entropy_without_reference_model_has_no_kl_context():
    rows = _entropy_seed_rows(kl=False)
    assert all(math.isnan(r["kl_ref_max"]) for r in rows)
    fired = check_health(rows)
    assert [(f.guard_id, f.step, f.serious) for f in fired] == [(GUARD_ENTROPY, 70, False)]
    assert fired[0].evidence["kl_ref_max_window_max"] is None and "kl_ref_max" not in fired[0].reason


def test_entropy_absolute_floor_for_a_low_entropy_model():
    rows = healthy_rows(60, 8, entropy=0.10)
    for r in rows[40:]:
        r["entropy"] = 0.035  # -65%: above both floors (0.2 x 0.10 = 0.02, absolute 0.03)
    assert detect_entropy(rows) == []
    for r in rows[40:]:
        r["entropy"] = 0.025  # under the absolute floor
    f = detect_entropy(rows)
    assert [x.step for x in f] == [43] and f[0].evidence["floor"] == pytest.approx(0.03)


def test_entropy_flicker_is_one_episode_and_a_recovery_rearms():
    rows = healthy_rows(120, 9, entropy=0.40)
    for i, r in enumerate(rows[40:70]):
        r["entropy"] = 0.05 if (i // 3) % 2 == 0 else 0.30  # steps 41-43 low, 44-46 back up, 47-49 low, ...
    for r in rows[90:]:
        r["entropy"] = 0.04  # a new episode after 20 healthy steps
    # The 5-step median is under the floor at 43-45, above at 46-48 (2 lows in the window), under at 49-51, ...:
    # the false stretches (3 steps) are shorter than the re-arm (5 steps), so it is one episode.
    assert [f.step for f in detect_entropy(rows)] == [43, 93]
    # Without the re-arm stretch every flicker would be a new firing.
    assert [f.step for f in detect_entropy(rows, EntropyConfig(rearm_steps=1))][:3] == [43, 49, 55]


# ----------------------------------------------------------------------------------------- G-reward-hacking
V6_EVALS = {20: 0.2890, 40: 0.2722, 60: 0.2666, 120: 0.2502, 160: 0.2350, 200: 0.2234}  # base 0.282


def _v6_rows(reward=(0.60, 0.70), seed=10) -> list[dict]:
    # seeds/001 v6 (lr=1e-5, beta=0.04): minerva_math 28.90 (step 20) ... 22.34 (step 200), base 28.2 (-5.9
    # points), while "training rewards looked healthy (reward_all ~0.6-0.7)".
    rows = healthy_rows(200, seed, reward=reward)
    for s, v in V6_EVALS.items():
        rows[s - 1]["eval/minerva_math"] = v
    return rows


def test_reward_hacking_v6_against_the_first_eval():
    rows = _v6_rows()
    fired = check_health(rows)
    assert [(f.guard_id, f.step) for f in fired] == [(GUARD_REWARD_HACKING, 160)]
    f = fired[0]
    # Level at 160 = mean(25.02, 23.50) = 24.26, first eval 28.90: -4.64 points; training reward up ~+0.08.
    assert not f.serious and f.key == "minerva_math"
    assert f.evidence["eval_change"] == pytest.approx(-0.0464) and f.evidence["train_change"] > 0.03
    assert f.evidence["reference"] == "first_eval" and f.evidence["reference_step"] == 20
    assert "eval/minerva_math" in f.reason and "-4.6 points" in f.reason
    assert check_health(rows[:159]) == []  # at step 120 the level is only -3.06


def test_reward_hacking_v6_against_the_base_model():
    rows = _v6_rows()
    cfg = RewardHackingConfig(base_eval={"minerva_math": 0.282})
    fired = detect_reward_hacking(rows, cfg)
    # vs base 28.2: level at 160 = 24.26 (-3.94, under the 4-point bar), at 200 = 22.92 (-5.28).
    assert [f.step for f in fired] == [200]
    assert fired[0].evidence["eval_change"] == pytest.approx(-0.0528) and fired[0].evidence["reference"] == "base"


def test_reward_hacking_needs_the_train_reward_not_to_fall():
    # Same held-out decline while the training reward falls too: degradation, not a train/held-out divergence.
    assert detect_reward_hacking(_v6_rows(reward=(0.70, 0.55))) == []
    # Held-out 0.40 -> 0.20 while train reward slips 0.70 -> 0.62: the gap (~+12 points) is over the divergence
    # bar, and only the "train reward did not fall" condition keeps this from being called reward hacking.
    rows = healthy_rows(200, 16, reward=(0.70, 0.62))
    for k, s in enumerate(range(20, 201, 20)):
        rows[s - 1]["eval/acc"] = 0.40 - 0.02 * k
    assert detect_reward_hacking(rows) == []
    fired = detect_reward_hacking(rows, RewardHackingConfig(min_train_rise=-1.0))
    assert fired and fired[0].evidence["train_change"] < 0 and fired[0].evidence["divergence"] > 0.05


def test_reward_hacking_noise_floor_from_the_eval_size():
    rows = _v6_rows()
    # 200 problems: 2 s.e. of (mean of 2 evals - first eval) ~ 7.7 points > the 4.6-point drop: within noise.
    assert detect_reward_hacking(rows, RewardHackingConfig(eval_n=200)) == []
    # MATH's 5,000 test problems: 2 s.e. ~ 1.5 points, the absolute 4-point bar decides, as without n.
    assert [f.step for f in detect_reward_hacking(rows, RewardHackingConfig(eval_n={"minerva_math": 5000}))] == [160]
    # The size can also come in the rows, as eval/<name>_n (which is itself never compared: not in [0, 1]).
    for s in V6_EVALS:
        rows[s - 1]["eval/minerva_math_n"] = 200
    assert detect_reward_hacking(rows) == []


def test_reward_hacking_per_eval_name_and_non_accuracy_columns_ignored():
    rows = _v6_rows()
    for s in V6_EVALS:
        rows[s - 1]["eval/gsm8k"] = 0.60 + s / 2000  # another eval that improves
        rows[s - 1]["eval/loss"] = 2.3 - s / 1000    # not an accuracy (> 1): never compared
    fired = detect_reward_hacking(rows)
    assert [(f.key, f.step) for f in fired] == [("minerva_math", 160)]
    assert detect_reward_hacking(rows, RewardHackingConfig(eval_names=("gsm8k",))) == []


def test_reward_hacking_fires_once_per_episode():
    rows = healthy_rows(400, 11, reward=(0.5, 0.7))
    evals = [0.30, 0.29, 0.25, 0.24, 0.25, 0.24, 0.24, 0.30, 0.31, 0.30, 0.30, 0.24, 0.23, 0.23, 0.22, 0.22]
    for k, v in enumerate(evals):
        rows[25 * (k + 1) - 1]["eval/acc"] = v
    # Drop confirmed at the 4th eval (step 100), stays down through step 175, recovers for 2+ evals, drops again
    # (level of the 13th eval, step 325).
    assert [f.step for f in detect_reward_hacking(rows)] == [100, 325]


# ----------------------------------------------------------------------------------------- G-kl-explosion
def test_kl_explosion_mean_and_max():
    rows = healthy_rows(40, 12)
    for r in rows[20:]:
        r["kl_ref_mean"] = 0.3  # seeds/001 adaptive run 4: "KL exploded ~0.3" where healthy was 0.03-0.06
    assert [f.step for f in detect_kl_explosion(rows)] == [23]
    rows = healthy_rows(40, 12)
    rows[30]["kl_ref_max"] = 2685.0  # seeds/001 MATH: KL spikes of ~2,685 within 8 steps, then NaN loss
    f = detect_kl_explosion(rows)
    assert [x.step for x in f] == [31] and not f[0].serious and "2685" in f[0].reason
    assert detect_kl_explosion(healthy_rows(40, 12, kl=False)) == []


# ----------------------------------------------------------------------------------------- edge cases
def test_too_few_steps_never_fire():
    assert check_health([]) == []
    rows = healthy_rows(5, 13)
    for r in healthy_rows(4, 14):
        r.update(step=r["step"] + 5, grad_norm=math.inf, reward_mean=0.0, completion_len_mean=1.0, entropy=0.0,
                 unique_frac_mean=0.125, ratio_max=21.75)
        rows.append(r)
    assert only(check_health(rows), GUARD_COLLAPSE) == []  # 9 steps: baseline 5 + window 5 not reached
    rows.append(dict(rows[-1], step=10))
    fired = only(check_health(rows), GUARD_COLLAPSE)
    assert [f.step for f in fired] == [10]
    assert set(fired[0].evidence["signals"]) >= {"grad_norm", "completion_len", "entropy", "repetition", "ratio"}
    assert "grad_norm max inf" in fired[0].reason  # +inf counts as a blow-up


def test_nan_and_missing_values_are_unknown_not_evidence():
    rows = healthy_rows(60, 15, kl=False)
    for r in rows:
        r["grad_norm"] = float("nan")  # ZeRO >= 1 without DeepSpeed's norm
        r["eval/acc"] = None           # steps.parquet gives None where a step was not evaluated
        del r["ratio_min"]
    assert check_health(rows) == []
    nan_rows = [{"step": i + 1, **{k: float("nan") for k in rows[0] if k != "step"}} for i in range(30)]
    assert check_health(nan_rows) == []
    for r in rows[40:]:
        r["reward_mean"], r["completion_len_mean"] = 0.0, 1.0
    fired = only(check_health(rows), GUARD_COLLAPSE)
    assert [f.step for f in fired] == [43] and "grad_norm" not in fired[0].evidence
    assert set(fired[0].evidence["signals"]) == {"reward", "completion_len"}


# ----------------------------------------------------------------------------------------- incremental use
def _mixed_failure_rows() -> list[dict]:
    rows = _v6_rows()
    for r in rows[170:185]:
        r["entropy"] = 0.02
    for r in rows[185:]:
        r["entropy"], r["unique_frac_mean"] = 0.01, 0.125
    return rows


def test_check_health_called_after_every_step_reports_each_episode_once():
    rows = _mixed_failure_rows()
    full = check_health(rows)
    assert {f.guard_id for f in full} == {GUARD_REWARD_HACKING, GUARD_ENTROPY, GUARD_COLLAPSE}
    seen: list[Firing] = []
    monitor = HealthMonitor()
    for n in range(1, len(rows) + 1):
        new = check_health(rows[:n], previous=seen)
        assert all(f.step == rows[n - 1]["step"] for f in new)  # causal: new firings are at the newest step
        assert monitor.update(rows[:n]) == new                   # the incremental form agrees
        seen += new
        assert check_health(rows[:n], previous=seen) == []      # asking again gives nothing new
    assert seen == full and len({f.ident for f in seen}) == len(seen)
    assert check_health(rows) == full  # idempotent
    collapse = only(full, GUARD_COLLAPSE)
    assert len(collapse) == 1 and collapse[0].serious and collapse[0].step == 188


def test_health_flags_and_config():
    rows = _mixed_failure_rows()
    full = check_health(rows)
    flags = health_flags(full, 160)
    assert set(flags) == {f"health/{g}" for g in GUARD_IDS}
    assert flags["health/G-reward-hacking"] == 1 and flags["health/G-collapse"] == 0
    only_collapse = check_health(rows, HealthConfig(enabled=(GUARD_COLLAPSE,)))
    assert {f.guard_id for f in only_collapse} == {GUARD_COLLAPSE}
    with pytest.raises(ValueError, match="unknown guard"):
        check_health(rows, HealthConfig(enabled=("G-nope",)))


def test_health_settings_come_from_the_yaml_config():
    from rlvr_core.experiment.config import ConfigError, parse_config
    from rlvr_core.grpo.step_metrics import StepGuards

    rows = healthy_rows(160, 1, reward=0.65, grad=0.45)
    for r in rows[150:]:
        r["grad_norm"], r["reward_mean"] = 46.75, 0.0  # the v5 collapse above: grad spike x ~100, reward to 0
    cfg = parse_config({"grpo": {"guards": {"health": {"collapse": {"grad_norm_factor": 200.0},
                                                  "kl_explosion": {"serious": True}}}}})
    assert only(check_health(rows), GUARD_COLLAPSE)  # the defaults catch it
    # A factor above the spike leaves one signal (reward), which alone is not a collapse.
    assert only(check_health(rows, cfg.grpo.guards.health), GUARD_COLLAPSE) == []
    guards = StepGuards([], cfg.grpo.guards.health)  # what the trainer builds from the config
    assert HealthConfig.model_validate({"entropy": {"serious_kl_max": None}}).entropy.serious_kl_max is None  # "never serious"
    assert guards.health.cfg.collapse.grad_norm_factor == 200.0 and guards.health.cfg.kl_explosion.serious
    for bad, why in (({"collapse": {"grad_norm_factr": 8}}, "collapse.grad_norm_factr: unknown key"),
                     ({"entropy": {"serious_kl_max": "big"}}, "entropy.serious_kl_max: expected float"),
                     ({"enabled": ["G-nope"]}, "unknown guard id")):
        with pytest.raises(ConfigError, match=why) as e:
            parse_config({"grpo": {"guards": {"health": bad}}}, "exp.yaml")
        assert "exp.yaml: grpo.guards.health" in str(e.value)


# ----------------------------------------------------------------------------------------- real trainer rows
from grpo_helpers import tiny_cfg, train_tiny  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _run_rows(tiny, out, cfg) -> list[dict]:
    import pyarrow.parquet as pq

    from rlvr_core.experiment.guards import GuardError

    try:
        path = train_tiny(tiny, out, cfg).steps_path
    except GuardError as e:  # once the trainer calls check_health itself, a collapse stops it
        assert "G-collapse" in str(e)
        path = out / "steps.parquet"
    return pq.read_table(path).to_pylist()


def test_real_trainer_rows_normal_lr_fire_nothing_and_high_lr_collapses(tiny, tmp_path):
    # The trainer tests' own lr (1e-2) on the tiny model: 20 real steps, nothing fires.
    rows = _run_rows(tiny, tmp_path / "ok", tiny_cfg(steps=20, warmup_steps=2))
    assert len(rows) == 20 and check_health(rows) == []
    # lr 0.5: within ~4 steps the policy turns deterministic (entropy ~4.5 -> ~0.01) and every group's
    # completions become identical (unique share 1 -> 1/G); it still scores 1.0 on the parity verifier.
    rows = _run_rows(tiny, tmp_path / "hot", tiny_cfg(steps=12, lr=0.5, warmup_steps=2))
    fired = only(check_health(rows), GUARD_COLLAPSE)
    assert len(fired) == 1 and fired[0].serious and 10 <= fired[0].step <= 12  # step 10: first evaluable step
    assert {"entropy", "repetition"} <= set(fired[0].evidence["signals"])


# ----------------------------------------------------------------------------------------- the base model's baselines
# `rlvr demo --set grpo.lr=0.5 --set grpo.steps=12` (demo base model, data seed 0, 2 threads; 2026-11-28), its 12
# step rows with the base model's numbers on each step's prompts (base/*: the pass-rate table's, as the trainer
# writes them). From step 2 nearly every completion runs to the 48-token cap; from step 4 no group has reward
# variance, so nothing is trained (kl_ref_* NaN here: measured before the trainer measured KL on such steps).
LR05_COLUMNS = ("step", "reward_mean", "truncation_share", "completion_len_mean", "entropy", "grad_norm",
                "unique_frac_mean", "zero_var_group_share", "kl_ref_mean", "kl_ref_max", "base/reward_mean",
                "base/truncation_share", "base/completion_len_mean")
LR05 = """
1 0.1289 0 15.76 0.2018 0.4203 0.6172 0.5 0 0 0.1289 0 15.76
2 0.03385 0.9297 46.59 3.957 78.09 1 0.8333 8.771 6276 0.07031 0 15.51
3 0.05208 0.9922 47.81 2.42 1.253 1 0.8333 8.483 1270 0.08333 0 15.42
4 0 1 48 - 0 0.1562 1 - - 0.112 0 15.76
5 0 1 48 - 0 0.1536 1 - - 0.09896 0 15.72
6 0 1 48 - 0 0.2526 1 - - 0.07552 0 15.5
7 0 1 48 - 0 0.6484 1 - - 0.1302 0 15.53
8 0 1 48 - 0 0.8958 1 - - 0.112 0 15.7
9 0 1 48 - 0 0.9505 1 - - 0.07552 0 15.8
10 0 1 48 - 0 0.9401 1 - - 0.1302 0 15.98
11 0 1 48 - 0 0.7005 1 - - 0.09635 0 15.61
12 0 1 48 - 0 0.5234 1 - - 0.08333 0 15.97
"""


def lr05_rows(base: bool = True) -> list[dict]:
    rows = []
    for line in LR05.strip().splitlines():
        row = {k: (float("nan") if v == "-" else float(v)) for k, v in zip(LR05_COLUMNS, line.split())}
        row["step"] = int(row["step"])
        rows.append({k: v for k, v in row.items() if base or not k.startswith("base/")})
    return rows


def with_base(rows: list[dict], reward: float, trunc: float = 0.0, length: float = 22.3) -> list[dict]:
    return [{**r, "base/reward_mean": reward, "base/truncation_share": trunc, "base/completion_len_mean": length}
            for r in rows]


def test_collapse_against_the_base_models_numbers_stops_the_lr_half_demo_at_step_6():
    # Reward 0 against the base model's ~0.08 on the same prompts, and every completion truncated against its 0 %:
    # two signals over steps 2-6. Judged from step 5 (the window) instead of step 10.
    (f,) = detect_collapse(lr05_rows())
    assert (f.step, f.serious, f.evidence["signals"]) == (6, True, ["reward", "truncation"])
    assert f.evidence["baseline"] == "base model on the same prompts"
    assert "the base model's" in f.reason and f.evidence["reward"]["base_expected"] == pytest.approx(0.08333)
    # The same rows without the base columns: the run's own first 5 steps are the baselines, and they are already
    # collapsed (truncation 99 %, a reward peak under 0.05), so nothing fires in 12 steps.
    assert detect_collapse(lr05_rows(base=False)) == []


def test_kl_blow_up_with_collapsing_rollouts_stops_by_default():
    # The same run's first 5 steps as the trainer records them now: on steps 4-5 nothing was trained, and the KL
    # to the reference was measured on the sampled completions (5.77 and 5.87), so the window holds 4 values.
    rows = lr05_rows()[:5]
    rows[3].update(kl_ref_mean=5.772, kl_ref_max=10.18)
    rows[4].update(kl_ref_mean=5.867, kl_ref_max=9.658)
    (f,) = detect_kl_explosion(rows)
    assert (f.step, f.serious, f.key) == (5, True, "")
    assert f.evidence["collapse_evidence"]["truncation_share_window_median"] == pytest.approx(0.9922)
    assert "with the rollouts collapsing" in f.reason
    # Without the opt-in default it is the flag it always was; a sustained KL with healthy rollouts is a flag.
    off = KLExplosionConfig(serious_on_collapse=False)
    assert [(x.step, x.serious) for x in detect_kl_explosion(rows, off)] == [(5, False)]
    healthy = healthy_rows(12, 3)
    for r in healthy[4:]:
        r["kl_ref_mean"] = 0.4
    assert [(x.step, x.serious) for x in detect_kl_explosion(with_base(healthy, 0.21))] == [(7, False)]


def test_kl_episode_escalates_once_when_the_collapse_evidence_comes_later():
    rows = with_base(healthy_rows(20, 5), 0.21)
    for r in rows[4:]:
        r["kl_ref_mean"] = 0.5
    for r in rows[12:]:
        r["zero_var_group_share"] = 1.0  # no group with a learning signal any more
    fired = detect_kl_explosion(rows)
    assert [(x.step, x.serious, x.key) for x in fired] == [(7, False, ""), (15, True, "collapse")]
    assert "zero-reward-variance groups" in fired[1].reason


def test_base_model_baselines_leave_healthy_runs_alone():
    real = real_k3_rows()
    early = {k: statistics.median(r[k] for r in real[:5]) for k in ("reward_mean", "completion_len_mean")}
    assert check_health(with_base(real, early["reward_mean"], 0.0, early["completion_len_mean"])) == \
        check_health(real)
    for seed in range(6):
        rows = healthy_rows(60, seed, reward=(0.1, 0.45))  # a run that learns from a base at ~0.1
        assert only(check_health(with_base(rows, 0.1)), GUARD_COLLAPSE) == []


def test_before_the_runs_own_baselines_exist_only_base_backed_signals_count():
    # Entropy, repetition and grad norm have no base-model number: they join at step 10 (5 baseline + 5 window).
    # Entropy at 0.001 (under the 0.03 floor whatever the baseline) and ratio_max 50 (limit 10) from step 1 on.
    rows = with_base(healthy_rows(12, 7), 0.21)
    for r in rows:
        r.update(entropy=0.001, ratio_max=50.0)
    (f,) = detect_collapse(rows)
    assert f.step == 10 and f.evidence["baseline"] == "base model on the same prompts"
    assert sorted(f.evidence["signals"]) == ["entropy", "ratio"]
    rows = with_base(healthy_rows(12, 7), 0.21)
    for r in rows[1:]:
        r.update(reward_mean=0.0, truncation_share=1.0)  # base-backed signals: judged at step 5
    assert [f.step for f in detect_collapse(rows)] == [5]
