import java.sql.*;

/** What a JDBC tool (Metabase's sync, DBeaver's navigator) asks a PostgreSQL server on connect:
 *  the schemas, the tables and views, each one's columns; then one query. One line per answer. */
public class JdbcClient {
    public static void main(String[] args) throws Exception {
        try (Connection connection = DriverManager.getConnection(args[0], args[1], args[2])) {
            DatabaseMetaData meta = connection.getMetaData();
            System.out.println("server\t" + meta.getDatabaseProductName() + "\t" + meta.getDatabaseProductVersion());
            try (ResultSet schemas = meta.getSchemas()) {
                while (schemas.next()) System.out.println("schema\t" + schemas.getString("TABLE_SCHEM"));
            }
            try (ResultSet tables = meta.getTables(null, "main", "%", new String[] {"TABLE", "VIEW"})) {
                while (tables.next()) {
                    String name = tables.getString("TABLE_NAME");
                    System.out.println("table\t" + name + "\t" + tables.getString("TABLE_TYPE"));
                    try (ResultSet columns = meta.getColumns(null, "main", name, "%")) {
                        while (columns.next()) {
                            System.out.println("column\t" + name + "\t" + columns.getString("COLUMN_NAME") + "\t"
                                + columns.getString("TYPE_NAME") + "\t" + columns.getInt("DATA_TYPE"));
                        }
                    }
                }
            }
            try (Statement statement = connection.createStatement();
                 ResultSet rows = statement.executeQuery(args[3])) {
                int count = 0;
                while (rows.next()) count++;
                System.out.println("rows\t" + count);
            }
        }
    }
}
