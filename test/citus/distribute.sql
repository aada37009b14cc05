-- After schema.sql on a Citus coordinator: accounts and ledger distributed by account, post_payment delegated by
-- its account to the node of that account's shard (force_delegation: also inside a transaction block).
SELECT create_distributed_table('accounts', 'account', shard_count => 8);
SELECT create_distributed_table('ledger', 'account', colocate_with => 'accounts');
SELECT create_distributed_function('post_payment(text,text,bigint)', 'p_account', colocate_with => 'accounts',
                                   force_delegation => true);
SELECT create_distributed_function('post_payment_bare(text,text,bigint)', 'p_account', colocate_with => 'accounts',
                                   force_delegation => true);
